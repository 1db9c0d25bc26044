#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/plot_bench.py on the committed run-26 bench JSON: every expected figure is written
# and is a non-empty PNG; an invalid JSON input makes it exit non-zero.
# Usage: tests/plot_bench_test.sh [PYTHON]   (default: $PYTHON, else python3)
# Exits 77 (skipped) where the interpreter has no matplotlib.
set -euo pipefail
py=${1:-${PYTHON:-python3}}
root=$(cd "$(dirname "$0")/.." && pwd)
tool=$root/tools/plot_bench.py
fail() { echo "plot_bench: FAIL: $*" >&2; exit 1; }

if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "plot_bench: SKIP: $py has no matplotlib"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The decode JSON's 'select' is empty in run 26: no select.png expected.
"$py" "$tool" "$root/docs/bench/run26-decode-final.json" \
  "$root/docs/bench/run26-routes-final.json" --out "$tmp/fig" >"$tmp/out" ||
  fail "exit $? on the run-26 JSON"
n=0
for name in decode multirow overlap; do
  png=$tmp/fig/$name.png
  [ -s "$png" ] || fail "$name.png missing or empty"
  sig=$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')
  [ "$sig" = 89504e470d0a1a0a ] || fail "$name.png is not a PNG (signature $sig)"
  grep -qxF "$png" "$tmp/out" || fail "$name.png written but its path not printed"
  n=$((n + 1))
done

printf '{"device": "x", "attention": [' >"$tmp/bad.json"
if "$py" "$tool" "$tmp/bad.json" --out "$tmp/bad" 2>"$tmp/err"; then
  fail "exit 0 on an invalid JSON input"
fi
grep -q "cannot read" "$tmp/err" || fail "no message on an invalid JSON input"

echo "plot_bench: PASS ($n figures)"
