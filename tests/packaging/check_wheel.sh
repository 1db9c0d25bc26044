#!/usr/bin/env bash
# python_wheel: `pip wheel bindings/python` builds libqsakv with CMake (scikit-build-core)
# and ships it in the wheel; the wheel installs into a fresh virtual environment, where
# `import qsakv` finds its own library with no environment variable and the quickstart
# runs; $QSAKV_LIBRARY still overrides.
#
#   tests/packaging/check_wheel.sh <cmake-build-dir> <work-dir> [python]
#
# The wheel's library is built CPU-only (QSAKV_WITH_CUDA=OFF, about 20 s on 2 cores):
# a CUDA wheel would compile the kernels for every release SM, minutes each. Its CMake
# build directory is kept in <work-dir>/build, so a rerun is incremental. NumPy (the
# package's one dependency) comes from the outer environment without a download: the
# venv sees the outer interpreter's site-packages (through a .pth file, as the outer
# one may itself be a venv, `make test`'s .venv, which --system-site-packages would
# skip); the checks below make sure qsakv itself is the wheel's, not anything outside.
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
py=${3:-python3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "python_wheel: FAIL $*" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
rm -rf "$work/dist" "$work/venv" "$work/run"
mkdir -p "$work/run"
"$py" -c "import scikit_build_core" 2>/dev/null ||
  fail "scikit-build-core is not installed for $py (tools/install-deps.sh installs it)"

# 1. Build the wheel (no build isolation: scikit-build-core of this environment, no
#    download).
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" \
  --config-settings=cmake.define.QSAKV_WITH_CUDA=OFF --config-settings=build-dir="$work/build" \
  "$repo/bindings/python"
whl=$(ls "$work"/dist/qsakv-*.whl)
echo "built $(basename "$whl")"

# 2. A platform wheel carrying the library.
plat=$("$py" -c "import sysconfig; print(sysconfig.get_platform().replace('-', '_').replace('.', '_'))")
case "$(basename "$whl")" in
  *-py3-none-"$plat".whl) ;;
  *) fail "wheel tag of $(basename "$whl"): expected py3-none-$plat (not a pure wheel)" ;;
esac
"$py" - "$whl" <<'PY' || fail "wheel contents"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
libs = [n for n in names if n.startswith("qsakv/libqsakv.so")]
wheel = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
print("library in the wheel:", libs, "| Root-Is-Purelib:", "false" if "Root-Is-Purelib: false" in wheel else "true")
assert libs == ["qsakv/libqsakv.so.0"], names
assert "Root-Is-Purelib: false" in wheel, wheel
assert "qsakv/_cdefs.py" in names
assert z.getinfo(libs[0]).file_size > 100_000
PY

# 3. A fresh venv, the wheel installed offline.
"$py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
outer=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
inner=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$outer" > "$inner/_outer_site_packages.pth"  # appended after the venv's own
"$vpy" -m pip install -q --no-deps --no-index "$whl"

# 4. Import with no library variable, from outside the repository.
clean_env=(env -u QSAKV_LIBRARY -u QSAKV_LIB -u PYTHONPATH -u LD_LIBRARY_PATH)
cd "$work/run"
"${clean_env[@]}" "$vpy" - "$work/venv" <<'PY' || fail "import qsakv from the venv"
import os, sys
import qsakv
venv = os.path.realpath(sys.argv[1])
print("qsakv", qsakv.__version__, "from", qsakv.__file__, "library", qsakv.library_path)
assert os.path.realpath(qsakv.__file__).startswith(venv), qsakv.__file__
assert os.path.realpath(qsakv.library_path).startswith(venv), qsakv.library_path
assert os.path.basename(qsakv.library_path) == "libqsakv.so.0"
assert qsakv.version() == qsakv.__version__
assert not qsakv.built_with_cuda()  # the CPU-only wheel of this test
PY

# 5. The quickstart, as a user runs it.
out=$("${clean_env[@]}" "$vpy" "$repo/examples/python/quickstart.py")
echo "$out" | tail -3
echo "$out" | grep -q "relative L2 error" || fail "the quickstart did not reach the pipeline"

# 6. $QSAKV_LIBRARY overrides the bundled library.
lib=$(readlink -f "$build/libqsakv.so")
got=$(env -u PYTHONPATH QSAKV_LIBRARY="$lib" "$vpy" -c "import qsakv; print(qsakv.library_path)")
[ "$got" = "$lib" ] || fail "QSAKV_LIBRARY=$lib loaded $got"
echo "python_wheel: PASSED ($(basename "$whl"); \$QSAKV_LIBRARY override loads $got)"
