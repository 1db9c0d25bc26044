#!/usr/bin/env python3
"""tests/SUITES, the one list of test suites, read for the Makefile and for checking a run.

  check_suites.py [--sanitize] CTEST_LOG SUITES
      Fails loudly when a suite that SUITES requires did not run, failed, or was skipped as
      a whole; prints each suite's cmocka/pytest summary lines (CTest keeps test output to
      itself unless a test fails), so a skipped GPU case is visible in every run. Reads
      ctest's console log ('Test #N: name ... Passed') and its LastTest.log. Required:
      every suite whose needs is '-' or 'tool'; with --sanitize only those of them that
      `make sanitize` runs (sanitize column asan or script). A 'tool' suite may be
      skipped (its toolchain is missing: it says which and how to install it), and is
      listed as such, unless CI=true or QSAKV_REQUIRE_ALL_SUITES=1 in the environment.
  check_suites.py list SUITES COLUMN=VALUE...
      Prints the names (one line, space-separated) of the suites whose columns have these
      values (e.g. sanitize=asan needs=-); the Makefile's lists come from here."""
import os
import re
import sys


# cmocka's PASSED / FAILED / SKIPPED lines, pytest's closing line, cargo's "test result"
# lines, go test's package verdict, and the verdict lines of the packaging scripts.
SUMMARY = re.compile(
    r"\[\s+(PASSED|FAILED|SKIPPED)\s+\]|^=* ?\d+ (passed|failed|skipped)"
    r"|^test result: (ok|FAILED)\. \d+ passed|^(ok|FAIL)\s+\S+\s+[\d.]+s"
    r"|^(-- )?(abi-check|python_wheel|test_install): (PASS|FAIL)|^regen\.sh: .*(matches|stale)"
    r"|^sm70-check: (\d+ kernels|SKIPPED|FAILED)|^  KNOWN spills|^check-layering: "
    r"|^SKIPPED: |: FAILED: .* not found")


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


COLUMNS = ("name", "sanitize", "needs")


def read_table(suites_path: str) -> list:
    """The rows of tests/SUITES as dicts (name, sanitize, needs); CMake checks the values."""
    rows = []
    for line in open(suites_path, encoding="utf-8"):
        fields = line.split()
        if not fields or line.startswith("#"):
            continue
        if len(fields) != len(COLUMNS):
            sys.exit(f"check_suites: {suites_path}: malformed line: {line.rstrip()}")
        rows.append(dict(zip(COLUMNS, fields)))
    return rows


def required(rows: list, sanitize: bool) -> list:
    """The suites a run must see: needs '-' or 'tool' (and, under ASan, asan or script)."""
    return [r["name"] for r in rows if r["needs"] in ("-", "tool") and
            (not sanitize or r["sanitize"] in ("asan", "script"))]


def all_required() -> bool:
    """Whether a 'tool' suite must pass too (CI), instead of being allowed to skip."""
    return (os.environ.get("CI") == "true" or
            os.environ.get("QSAKV_REQUIRE_ALL_SUITES") == "1")


def list_names(suites_path: str, conditions: list) -> int:
    want = dict(c.split("=", 1) for c in conditions)
    unknown = set(want) - set(COLUMNS)
    if unknown:
        sys.exit(f"check_suites: no column {', '.join(sorted(unknown))} in {suites_path}")
    rows = read_table(suites_path)
    print(" ".join(r["name"] for r in rows if all(r[k] == v for k, v in want.items())))
    return 0


def main(log_path: str, suites_path: str, sanitize: bool = False) -> int:
    log = open(log_path, encoding="utf-8", errors="replace").read()
    rows = read_table(suites_path)
    expected = required(rows, sanitize)
    tool_suites = {r["name"] for r in rows if r["needs"] == "tool"}
    may_skip = not all_required()
    status = {}
    for m in re.finditer(r"Test\s+#\d+:\s+(\S+)\s+\.+\**\s*(\w+)", log):
        status[m.group(1)] = m.group(2)
    last = os.path.join(os.path.dirname(log_path), "Testing", "Temporary", "LastTest.log")
    lines = summaries(last)
    for name in sorted(status):
        for l in lines.get(name, []):
            print(f"  {name}: {l}")
    bad, skipped = [], []
    for name in expected:
        st = status.get(name)
        if st is None:
            bad.append(f"{name}: did not run (missing from the build?)")
        elif st == "Skipped" and name in tool_suites and may_skip:
            why = [l for l in lines.get(name, []) if l.startswith(("SKIPPED", "sm70-check"))]
            skipped.append(f"{name}: {why[0] if why else 'skipped'}")
        elif st != "Passed":
            bad.append(f"{name}: {st}")
    for s in skipped:
        print(f"check_suites: skipped (its toolchain or Python test packages are missing; CI requires them) {s}")
    for b in bad:
        print(f"check_suites: FAIL {b}", file=sys.stderr)
    ran = len([n for n in expected if status.get(n) == "Passed"])
    print(f"suites: {ran} passed, {len(skipped)} skipped, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["list"] and len(args) >= 2:
        sys.exit(list_names(args[1], args[2:]))
    san = args[:1] == ["--sanitize"]
    if san:
        args = args[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(args[0], args[1], san))
