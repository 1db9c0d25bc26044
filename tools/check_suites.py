#!/usr/bin/env python3
"""Fails loudly when a suite named in tests/SUITES did not run, failed, or was skipped as
a whole; prints each suite's cmocka/pytest summary lines (CTest keeps test output to
itself unless a test fails), so a skipped GPU case is visible in every run.

Reads ctest's console log ('Test #N: name ... Passed') and its LastTest.log."""
import os
import re
import sys


# cmocka's PASSED / FAILED / SKIPPED lines, pytest's closing line, cargo's "test result"
# lines, go test's package verdict, and the verdict lines of the packaging scripts.
SUMMARY = re.compile(
    r"\[\s+(PASSED|FAILED|SKIPPED)\s+\]|^=* ?\d+ (passed|failed|skipped)"
    r"|^test result: (ok|FAILED)\. \d+ passed|^(ok|FAIL)\s+\S+\s+[\d.]+s"
    r"|^(-- )?(abi-check|python_wheel|test_install): (PASS|FAIL)|^regen\.sh: .*(matches|stale)"
    r"|^sm70-check: (\d+ kernels|SKIPPED|FAILED)|^  KNOWN spills")


def summaries(last_test_log: str) -> dict:
    """Per test name, the summary lines of its output (cmocka's PASSED / FAILED / SKIPPED
    lines, pytest's closing line)."""
    out = {}
    if not os.path.exists(last_test_log):
        return out
    current = None
    for line in open(last_test_log, encoding="utf-8", errors="replace"):
        m = re.match(r"\d+/\d+ Test: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        if current and re.search(SUMMARY, line):
            kept = out.setdefault(current, [])
            if line.strip() not in kept and "listed below" not in line:
                kept.append(line.strip())
    return out


def main(log_path: str, suites_path: str) -> int:
    log = open(log_path, encoding="utf-8", errors="replace").read()
    expected = [s.strip() for s in open(suites_path) if s.strip() and not s.startswith("#")]
    status = {}
    for m in re.finditer(r"Test\s+#\d+:\s+(\S+)\s+\.+\**\s*(\w+)", log):
        status[m.group(1)] = m.group(2)
    last = os.path.join(os.path.dirname(log_path), "Testing", "Temporary", "LastTest.log")
    lines = summaries(last)
    for name in sorted(status):
        for l in lines.get(name, []):
            print(f"  {name}: {l}")
    bad = []
    for name in expected:
        st = status.get(name)
        if st is None:
            bad.append(f"{name}: did not run (missing from the build?)")
        elif st != "Passed":
            bad.append(f"{name}: {st}")
    for b in bad:
        print(f"check_suites: FAIL {b}", file=sys.stderr)
    ran = len([n for n in expected if status.get(n) == "Passed"])
    print(f"suites: {ran} passed, {len(expected) - ran} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
