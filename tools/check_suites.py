#!/usr/bin/env python3
"""Fails loudly when a suite named in tests/SUITES did not run, failed, or was skipped
as a whole. Reads ctest's log: a suite appears as 'Test #N: name ... Passed'."""
import re
import sys


def main(log_path: str, suites_path: str) -> int:
    log = open(log_path, encoding="utf-8", errors="replace").read()
    expected = [s.strip() for s in open(suites_path) if s.strip() and not s.startswith("#")]
    status = {}
    for m in re.finditer(r"Test\s+#\d+:\s+(\S+)\s+\.+\**\s*(\w+)", log):
        status[m.group(1)] = m.group(2)
    bad = []
    for name in expected:
        st = status.get(name)
        if st is None:
            bad.append(f"{name}: did not run (missing from the build?)")
        elif st != "Passed":
            bad.append(f"{name}: {st}")
    ran = len([n for n in expected if status.get(n) == "Passed"])
    print(f"check_suites: {ran}/{len(expected)} suites passed")
    for b in bad:
        print(f"check_suites: FAIL {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
