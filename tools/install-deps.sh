#!/usr/bin/env bash
# Installs the system and Python packages the build and tests need, when missing.
# Debian: cmocka, nlohmann-json, OpenSSL headers, SWIG; PyPI: numpy, ml_dtypes,
# safetensors, pytest, pycparser, wheel. As root it installs; otherwise it prints the
# exact commands and stops.
set -euo pipefail
need_apt=()
[ -f /usr/include/cmocka.h ] || need_apt+=(libcmocka-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
[ -f /usr/include/openssl/evp.h ] || need_apt+=(libssl-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v nm >/dev/null || need_apt+=(binutils)
command -v swig >/dev/null || need_apt+=(swig)  # the SWIG Python module and its tests
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing packages; run: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
fi
PY=${PYTHON:-python3}
need_pip=()
for mod in numpy ml_dtypes safetensors pytest pycparser wheel; do
  $PY -c "import $mod" 2>/dev/null || need_pip+=("$mod")
done
if [ ${#need_pip[@]} -gt 0 ]; then
  $PY -m pip install -q "${need_pip[@]}" || {
    echo "missing Python packages; run: $PY -m pip install ${need_pip[*]}" >&2
    exit 1
  }
fi
