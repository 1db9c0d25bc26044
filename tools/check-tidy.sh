#!/usr/bin/env bash
# clang-tidy (.clang-tidy at the root) over the library's sources (src/), from a CMake
# build tree's compile_commands.json. Usage: tools/check-tidy.sh BUILD_DIR [FILE...]
# (no files: every src/*.cpp). Fails on any warning.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/check-tidy.sh BUILD_DIR [FILE...]}
shift
command -v clang-tidy >/dev/null || {
  echo "check-tidy: clang-tidy not found (apt-get install clang-tidy; tools/install-deps.sh does)" >&2
  exit 1; }
[ -f "$build/compile_commands.json" ] || {
  echo "check-tidy: $build/compile_commands.json missing (configure with CMake first)" >&2
  exit 1; }
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files 'src/*.cpp'); fi
# Two at a time: the machines this runs on have two cores.
printf '%s\n' "${files[@]}" | xargs -P 2 -n 4 clang-tidy -p "$build" --quiet 2>/dev/null > "$build/tidy.log" || rc=$?
if grep -q "warning:\|error:" "$build/tidy.log"; then
  grep -A3 "warning:\|error:" "$build/tidy.log" >&2
  echo "check-tidy: findings above ($build/tidy.log)" >&2
  exit 1
fi
[ "${rc:-0}" = 0 ] || { cat "$build/tidy.log" >&2; echo "check-tidy: clang-tidy failed" >&2; exit 1; }
echo "check-tidy: ${#files[@]} files clean ($(clang-tidy --version | grep -o 'version [0-9.]*'))"
