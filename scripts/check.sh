#!/usr/bin/env bash
# The fast checks before a commit (well under a minute on 2 cores): formatting of every
# source, the include layering (kernels/ includes nothing from src/), clang-tidy of the library sources changed since main (all of them with --all),
# and that tests/SUITES and the registered tests agree (a reconfigure). The full run is
# `make test`.
# Usage: scripts/check.sh [--all] [BUILD_DIR (default build)]
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [ "${1:-}" = "--all" ]; then all=1; shift; fi
build=${1:-build}
bash tools/check-format.sh
bash tools/check-layering.sh
[ -f "$build/compile_commands.json" ] || cmake -S . -B "$build" >/dev/null
if [ $all = 1 ]; then
  bash tools/check-tidy.sh "$build"
else
  base=$(git merge-base HEAD main 2>/dev/null || git rev-list --max-parents=0 HEAD | tail -1)
  mapfile -t changed < <( { git diff --name-only "$base" -- 'src/*.cpp'; git ls-files -o --exclude-standard 'src/*.cpp'; } | sort -u)
  present=()
  for f in "${changed[@]}"; do [ -f "$f" ] && present+=("$f"); done
  if [ ${#present[@]} -gt 0 ]; then bash tools/check-tidy.sh "$build" "${present[@]}"
  else echo "check-tidy: no library source changed since main"; fi
fi
# Configuring holds tests/SUITES and the registered tests together (qsakv_check_suites in
# tests/CMakeLists.txt): it stops on any disagreement.
cmake -S . -B "$build" >/dev/null
echo "check: tests/SUITES and the registered tests agree"
