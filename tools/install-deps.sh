#!/usr/bin/env bash
# Installs what a purpose needs, when missing, and says what it installs. Never more than
# the purpose asks for.
#
#   tools/install-deps.sh [--build | --test | --maintainer | --system | --python | --cuda12]
#   (no option: everything CI needs: --system, --python, --cuda12)
#
# --build: what building the library, the tool and the demo needs: a C/C++ compiler,
#   CMake, nlohmann-json and OpenSSL's headers (Debian packages; CUDA is found by CMake
#   where it is installed, and is optional). `make`, `make demo` and `make install` run
#   this part only.
# --test: the test suites' system packages: cmocka (the C test framework), pkg-config,
#   binutils (nm), python3-venv (the Python test environment), SWIG (the SWIG module).
# --maintainer: the maintainers' and the other languages' toolchains, each for its
#   suite (tests/SUITES, needs `tool`): clang-format (format_check), clang-tidy
#   (tidy_check), abigail-tools (test_abi), bindgen with libclang (rust_sys_bindings),
#   cargo when no Rust toolchain is found (rust_qsakv; rustup's ~/.cargo/bin counts),
#   golang-go (go_qsakv). Without them those suites report SKIPPED with the command that
#   installs them (and fail under CI=true or QSAKV_REQUIRE_ALL_SUITES=1).
# --system: --build, --test and --maintainer together (what `make test` and CI run).
# As root the packages are installed with apt-get. Without root, or when apt-get cannot
# reach a mirror, the exact command is printed instead; the run then fails only for
# --build (nothing builds without those), and succeeds otherwise (the suites that need
# what is missing say so when they run).
# --python: the Python test dependencies (numpy, ml_dtypes, safetensors, pytest,
#   pycparser, wheel, scikit-build-core; matplotlib for tools/plot_bench.py) into a
#   project-local virtual environment,
#   $QSAKV_VENV (default: .venv at the repository root, git-ignored), made with
#   `$PYTHON -m venv` (PYTHON defaults to python3). No system pip is used, so this works
#   on a Debian system Python (PEP 668, "externally-managed-environment"). `make test`
#   runs this part and the Python-driven suites with the venv's interpreter. pip needs
#   PyPI (or a configured index/mirror) the first time; later runs install nothing.
# --cuda12: CUDA 12.9's NVRTC, ptxas and runtime headers from PyPI (nvidia-cuda-nvrtc-cu12,
#   nvidia-cuda-nvcc-cu12, nvidia-cuda-runtime-cu12, pinned) into $QSAKV_CUDA12_ROOT
#   (default: .deps-cuda12 at the repository root, git-ignored), with the venv's pip. CUDA
#   13 has no sm_70 target; the sm70_build suite (tools/sm70-check.sh) builds the SM70
#   kernel tier for sm_70 with these. (PyPI's nvidia-cuda-nvcc-cu12 carries ptxas and
#   libnvvm but not the nvcc driver, hence NVRTC.) About 200 MB.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
VENV=${QSAKV_VENV:-$repo/.venv}
# import name=PyPI name
CUDA12_ROOT=${QSAKV_CUDA12_ROOT:-$repo/.deps-cuda12}
CUDA12_PACKAGES=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86
                 nvidia-cuda-runtime-cu12==12.9.79)
PY_PACKAGES=(numpy ml_dtypes safetensors pytest pycparser wheel scikit_build_core=scikit-build-core
             matplotlib)

say() { echo "install-deps: $*"; }

# Appends to need_apt the packages of a purpose that are missing.
build_packages() {
  command -v cmake >/dev/null || need_apt+=(cmake)
  command -v c++ >/dev/null || command -v g++ >/dev/null || need_apt+=(g++)
  [ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
  [ -f /usr/include/openssl/evp.h ] || need_apt+=(libssl-dev)
}
test_packages() {
  [ -f /usr/include/cmocka.h ] || need_apt+=(libcmocka-dev)
  command -v nm >/dev/null || need_apt+=(binutils)
  command -v pkg-config >/dev/null || need_apt+=(pkg-config)  # test_install, go_qsakv
  command -v swig >/dev/null || need_apt+=(swig)  # the SWIG Python module and its tests
  # The test venv and python_wheel's venv need venv + ensurepip (Debian splits them out).
  "$PY" -c "import ensurepip, venv" 2>/dev/null || need_apt+=(python3-venv)
}
maintainer_packages() {
  command -v clang-format >/dev/null || need_apt+=(clang-format)  # format_check
  command -v clang-tidy >/dev/null || need_apt+=(clang-tidy)  # tidy_check
  command -v abidiff >/dev/null || need_apt+=(abigail-tools)  # test_abi
  command -v bindgen >/dev/null || need_apt+=(bindgen)  # rust_sys_bindings
  command -v go >/dev/null || need_apt+=(golang-go)  # go_qsakv
  command -v cargo >/dev/null || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ] ||
    need_apt+=(cargo)  # rust_qsakv
}

# system_deps WHAT REQUIRED: installs need_apt (WHAT names the purpose); REQUIRED=1 fails
# when they cannot be installed.
system_deps() {
  local what=$1 required=$2
  if [ ${#need_apt[@]} -eq 0 ]; then
    say "$what packages: all present"
    return 0
  fi
  local cmd="apt-get install -y ${need_apt[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: $what packages missing (${need_apt[*]}); install them with:" >&2
    echo "  sudo $cmd" >&2
    [ "$required" = 1 ] && exit 1
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  say "apt-get update; $cmd"
  if ! { apt-get update -q && apt-get install -y "${need_apt[@]}"; }; then
    echo "install-deps: apt-get could not install ${need_apt[*]} (no package mirror?);" \
         "install them with: $cmd" >&2
    [ "$required" = 1 ] && exit 1
    return 0
  fi
}

python_deps() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating the Python test environment $VENV ($("$PY" --version 2>&1), $PY -m venv)"
    "$PY" -m venv "$VENV" || {
      rm -rf "$VENV"
      echo "install-deps: '$PY -m venv' failed; on Debian/Ubuntu run: sudo apt-get install" \
           "-y python3-venv (or run this script as root without --python)" >&2
      exit 1
    }
  fi
  local vpy="$VENV/bin/python" need_pip=() mod
  for mod in "${PY_PACKAGES[@]}"; do
    "$vpy" -c "import ${mod%%=*}" 2>/dev/null || need_pip+=("${mod#*=}")
  done
  if [ ${#need_pip[@]} -eq 0 ]; then
    say "Python test packages: all present in $VENV"
  else
    say "pip install into $VENV: ${need_pip[*]}"
    "$vpy" -m pip install --disable-pip-version-check --progress-bar off "${need_pip[@]}" || {
      echo "install-deps: pip could not install ${need_pip[*]} into $VENV (no network or" \
           "index?); retry with: $vpy -m pip install ${need_pip[*]}" >&2
      exit 1
    }
  fi
  touch "$VENV/.qsakv-deps-ok"  # the Makefile's stamp: newer than this script = done
}

cuda12_deps() {
  if [ -f "$CUDA12_ROOT/.qsakv-cuda12-ok" ]; then
    say "CUDA 12.9 NVRTC/ptxas (sm_70 build check): present in $CUDA12_ROOT"
    return 0
  fi
  [ -x "$VENV/bin/python" ] || python_deps
  say "pip install --target $CUDA12_ROOT: ${CUDA12_PACKAGES[*]}"
  rm -rf "$CUDA12_ROOT"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-deps \
    --target "$CUDA12_ROOT" "${CUDA12_PACKAGES[@]}" || {
    echo "install-deps: pip could not install ${CUDA12_PACKAGES[*]} into $CUDA12_ROOT" >&2
    exit 1
  }
  touch "$CUDA12_ROOT/.qsakv-cuda12-ok"
}

# --system: the build's packages are required, the others are not.
system_all() {
  build_packages; system_deps build 1
  need_apt=(); test_packages; maintainer_packages; system_deps "test and maintainer" 0
}

need_apt=()
case "${1:-all}" in
  --build) build_packages; system_deps build 1 ;;
  --test) test_packages; system_deps test 0 ;;
  --maintainer) maintainer_packages; system_deps maintainer 0 ;;
  --system) system_all ;;
  --python) python_deps ;;
  --cuda12) cuda12_deps ;;
  all) system_all; python_deps; cuda12_deps ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "install-deps: unknown option $1 (--build, --test, --maintainer, --system, --python, --cuda12, or none for all)" >&2; exit 2 ;;
esac
