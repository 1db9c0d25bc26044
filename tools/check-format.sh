#!/usr/bin/env bash
# Fails when a C, C++ or CUDA source of the repository differs from what clang-format
# (.clang-format at the root) makes of it; prints the files and how to fix them. Generated
# files are not checked. Usage: tools/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
  echo "check-format: clang-format not found (apt-get install clang-format; tools/install-deps.sh does)" >&2
  exit 1; }
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.hpp' 'src/*.cu' 'include/*.h' 'include/*.hpp' \
  'kernels/*.cuh' 'kernels/*.cu' 'kernels/*.hpp' 'tests/*.c' 'tests/*.cpp' 'tests/*.h' \
  'tools/*.c' 'tools/*.cpp' 'tools/*.cu' 'tools/*.h' 'tools/*.hpp' 'examples/*.c' 'bindings/*.c' 'bindings/*.cpp')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not clang-formatted:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run tools/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($(clang-format --version | head -1))"
