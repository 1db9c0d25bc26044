"""The generated declarations: no drift from the header, struct layouts identical to
what the C compiler makes of qsakv.h, versions checked at import, packaging."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

import qsakv
from qsakv import _cdefs
from conftest import REPO

GEN = REPO / "bindings" / "python" / "tools" / "gen_cdefs.py"

# The generator needs pycparser (installed by tools/install-deps.sh, so CI always runs
# these); on a machine without it the two generator tests say they skipped.
needs_pycparser = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import pycparser"], capture_output=True).returncode != 0,
    reason="pycparser is not installed: the drift check cannot run here")


@needs_pycparser
def test_committed_cdefs_match_the_header():
    r = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, f"_cdefs.py drifted from include/qsakv.h:\n{r.stdout}{r.stderr}"


@needs_pycparser
def test_check_detects_drift(tmp_path):
    stale = tmp_path / "_cdefs.py"
    stale.write_text((REPO / "bindings/python/qsakv/_cdefs.py").read_text()
                     .replace("('head_dim', ctypes.c_int32)", "('head_dim', ctypes.c_int64)"))
    r = subprocess.run([sys.executable, str(GEN), "--check", "--output", str(stale)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "head_dim" in r.stdout


def _records():
    return [c for c in vars(_cdefs).values()
            if isinstance(c, type) and issubclass(c, ctypes.Structure) and hasattr(c, "_fields_")]


def test_layouts_match_the_c_compiler(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to compare layouts with")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "qsakv.h"', "int main(void) {"]
    expect = []
    for rec in _records():
        name = rec.__name__
        lines.append(f'  printf("{name} %zu\\n", sizeof({name}));')
        expect.append(f"{name} {ctypes.sizeof(rec)}")
        for field, _ in rec._fields_:
            lines.append(f'  printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
            expect.append(f"{name}.{field} {getattr(rec, field).offset}")
    lines += ["  return 0;", "}"]
    (tmp_path / "layout.c").write_text("\n".join(lines))
    subprocess.run([cc, "-std=c99", "-I", str(REPO / "include"), "-o", str(tmp_path / "layout"),
                    str(tmp_path / "layout.c")], check=True)
    got = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                         check=True).stdout.split("\n")[:-1]
    assert got == expect
    assert len(_records()) >= 12


def test_header_constants_and_versions():
    header = (REPO / "include" / "qsakv.h").read_text()
    for name in ("QSAKV_ABI_VERSION", "QSAKV_VERSION_MAJOR", "QSAKV_MAX_LAYERS"):
        assert getattr(_cdefs, name) == int(re.search(rf"#define {name} (\d+)", header)[1])
    assert qsakv.lib.qsakv_version() == _cdefs.QSAKV_VERSION_NUMBER
    assert qsakv.version() == qsakv.__version__
    assert qsakv.missing_functions == (), "the library lacks functions the header declares"
    pyproject = (REPO / "bindings/python/pyproject.toml").read_text()
    assert f'version = "{qsakv.__version__}"' in pyproject


def test_import_refuses_a_library_of_another_version(tmp_path):
    """A fake libqsakv reporting another version is refused at import."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the fake library")
    src = tmp_path / "fake.c"
    src.write_text("int qsakv_version(void){return 999999;}\n"
                   "int qsakv_abi_version(void){return 0;}\n")
    so = tmp_path / "libqsakv.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    env = dict(os.environ, QSAKV_LIBRARY=str(so))
    r = subprocess.run([sys.executable, "-c", "import qsakv"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "version 999999" in r.stderr and "ImportError" in r.stderr


def test_pip_installs_the_package_offline(tmp_path):
    pytest.importorskip("setuptools")
    target, src = tmp_path / "site", tmp_path / "src"
    # From a copy: setuptools builds in the source tree (build/, *.egg-info).
    shutil.copytree(REPO / "bindings" / "python", src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(target),
                        str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (target / "qsakv" / "_cdefs.py").exists()
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", "import qsakv; print(qsakv.__file__)"],
                       env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and str(target) in r.stdout, r.stderr
