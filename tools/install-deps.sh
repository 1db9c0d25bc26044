#!/usr/bin/env bash
# Installs the system and Python packages the build and tests need, when missing.
# Debian: cmocka, nlohmann-json, OpenSSL headers, SWIG; for the packaging and binding
# suites pkg-config, bindgen (Rust FFI generation, with libclang), golang-go (the cgo
# package), abigail-tools (the ABI guard), and cargo only when no Rust toolchain is
# found (rustup's ~/.cargo/bin counts); PyPI: numpy, ml_dtypes, safetensors, pytest,
# pycparser, wheel, scikit-build-core (the wheel build). As root it installs;
# otherwise it prints the exact commands and stops.
set -euo pipefail
PY=${PYTHON:-python3}
need_apt=()
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
command -v cargo >/dev/null || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ] ||
  need_apt+=(cargo)  # rust_qsakv
# python_wheel installs the wheel into a fresh venv (Debian splits ensurepip out).
$PY -c "import ensurepip, venv" 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing packages; run: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
fi
need_pip=()
# import name=PyPI name
for mod in numpy ml_dtypes safetensors pytest pycparser wheel scikit_build_core=scikit-build-core; do
  $PY -c "import ${mod%%=*}" 2>/dev/null || need_pip+=("${mod#*=}")
done
if [ ${#need_pip[@]} -gt 0 ]; then
  $PY -m pip install -q "${need_pip[@]}" || {
    echo "missing Python packages; run: $PY -m pip install ${need_pip[*]}" >&2
    exit 1
  }
fi
