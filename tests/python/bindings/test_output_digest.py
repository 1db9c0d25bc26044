"""tools/output_digest.py (the bit-identity check between two builds, used on the GPU)
runs on the CPU backend, names every case, and is deterministic: two runs of one build
print the same digests, and distinct outputs get distinct digests."""
import os
import re
import subprocess
import sys

from conftest import REPO

LINE = re.compile(r"^auto (e4m3|fp16) route=(decode|auto|grouped2) (topk|sparse|dense): "
                  r"([0-9a-f]{24})  \(groups (\d+)\)$")


def run_digest():
    r = subprocess.run([sys.executable, str(REPO / "tools/output_digest.py"), "--cpu", "--small"],
                       env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_output_digest_on_cpu():
    first = run_digest()
    # 2 cache types x 3 routes x 3 outputs, each line well formed.
    assert len(first) == 18, first
    parsed = [LINE.match(line) for line in first]
    assert all(parsed), first
    assert run_digest() == first  # deterministic
    by_case = {(m[1], m[2], m[3]): m[4] for m in parsed}
    for dtype in ("e4m3", "fp16"):
        outs = {by_case[(dtype, "decode", o)] for o in ("topk", "sparse", "dense")}
        assert len(outs) == 3, by_case  # three different outputs, three digests
    for out in ("sparse", "dense"):  # the same output of two cache types
        assert by_case[("e4m3", "decode", out)] != by_case[("fp16", "decode", out)]
    # The CPU backend has no grouped route: every route computes the same bytes.
    assert all(int(m[5]) == 0 for m in parsed)
    for key, value in by_case.items():
        assert value == by_case[(key[0], "decode", key[2])], key
