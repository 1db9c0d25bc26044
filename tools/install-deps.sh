#!/usr/bin/env bash
# Installs what the build and the tests need, when missing, and says what it installs.
#
#   tools/install-deps.sh [--system | --python | --cuda12]     (no option: all three)
#
# --system: Debian packages for the build (cmocka, nlohmann-json, OpenSSL headers, SWIG)
#   and for the packaging and binding suites (pkg-config, bindgen with libclang,
#   golang-go, abigail-tools, python3-venv, and cargo only when no Rust toolchain is
#   found; rustup's ~/.cargo/bin counts). As root it installs them with apt-get;
#   otherwise it prints the exact command and stops. `make build` / `make demo` need
#   only this part: the C demo needs no Python package.
# --python: the Python test dependencies (numpy, ml_dtypes, safetensors, pytest,
#   pycparser, wheel, scikit-build-core) into a project-local virtual environment,
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
PY_PACKAGES=(numpy ml_dtypes safetensors pytest pycparser wheel scikit_build_core=scikit-build-core)

say() { echo "install-deps: $*"; }

system_deps() {
  local need_apt=()
  [ -f /usr/include/cmocka.h ] || need_apt+=(libcmocka-dev)
  [ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
  [ -f /usr/include/openssl/evp.h ] || need_apt+=(libssl-dev)
  command -v cmake >/dev/null || need_apt+=(cmake)
  command -v nm >/dev/null || need_apt+=(binutils)
  command -v swig >/dev/null || need_apt+=(swig)  # the SWIG Python module and its tests
  command -v pkg-config >/dev/null || need_apt+=(pkg-config)  # test_install, go_qsakv
  command -v bindgen >/dev/null || need_apt+=(bindgen)  # rust_sys_bindings
  command -v go >/dev/null || need_apt+=(golang-go)  # go_qsakv
  command -v abidiff >/dev/null || need_apt+=(abigail-tools)  # test_abi
  command -v clang-format >/dev/null || need_apt+=(clang-format)  # format_check
  command -v clang-tidy >/dev/null || need_apt+=(clang-tidy)  # tidy_check
  command -v cargo >/dev/null || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ] ||
    need_apt+=(cargo)  # rust_qsakv
  # The test venv and python_wheel's venv need venv + ensurepip (Debian splits them out).
  "$PY" -c "import ensurepip, venv" 2>/dev/null || need_apt+=(python3-venv)
  if [ ${#need_apt[@]} -eq 0 ]; then
    say "system packages: all present"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages; run: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  say "apt-get update"
  apt-get update -q
  say "apt-get install ${need_apt[*]}"
  apt-get install -y "${need_apt[@]}"
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

case "${1:-all}" in
  --system) system_deps ;;
  --python) python_deps ;;
  --cuda12) cuda12_deps ;;
  all) system_deps; python_deps; cuda12_deps ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "install-deps: unknown option $1 (--system, --python, --cuda12, or none for all)" >&2; exit 2 ;;
esac
