"""examples/python/quickstart.py runs end to end and reports a plausible E4M3 error."""
import os
import re
import subprocess
import sys

from conftest import REPO


def test_quickstart_runs():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, str(REPO / "examples/python/quickstart.py")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "QSAKV_ERROR_REVISION_MISMATCH" in r.stdout
    err = float(re.search(r"relative L2 error ([0-9.e+-]+)", r.stdout)[1])
    assert 1e-3 < err < 0.1, r.stdout
