#!/usr/bin/env bash
# ABI guard of libqsakv (abigail-tools): compares the built library with the committed
# baseline abi/libqsakv.so.<ABI>.abi.gz (an abidw dump, gzipped).
#
#   tools/abi-check.sh <build-dir>            check (what `make test` runs: test_abi)
#   tools/abi-check.sh --update <build-dir>   rewrite the baseline (an intentional change)
#
# Only the public headers' types count (abidiff --hd1/--hd2: changes to the private
# structs behind the opaque handles are filtered). Verdicts:
#   - no change: pass;
#   - only added functions/variables: pass, with a note to update the baseline;
#   - anything removed or changed (a struct field moved, resized or retyped, a struct
#     grown, an enumerator's value, a parameter type): fail. If the change is intended,
#     bump QSAKV_ABI_VERSION in CMakeLists.txt when it breaks old callers (a field moved
#     or retyped, a function removed), then run --update and commit the new baseline.
# A negative control runs each time: a stub library lacking the API must be reported as
# incompatible, so a broken abidiff invocation cannot pass silently.
set -euo pipefail
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
build=${1:?usage: tools/abi-check.sh [--update] <build-dir>}
repo=$(cd "$(dirname "$0")/.." && pwd)
for tool in abidw abidiff gzip "${CC:-cc}"; do
  command -v "$tool" >/dev/null || {
    echo "abi-check: $tool not found (tools/install-deps.sh installs abigail-tools)" >&2
    exit 1; }
done
lib=$(readlink -f "$build/libqsakv.so")
ver_h="$build/include/qsakv_version.h"
[ -f "$lib" ] && [ -f "$ver_h" ] || { echo "abi-check: no built library in $build" >&2; exit 1; }
abi=$(sed -n 's/^#define QSAKV_ABI_VERSION \([0-9]*\)$/\1/p' "$ver_h")
baseline="$repo/abi/libqsakv.so.$abi.abi.gz"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/headers"
cp "$repo/include/qsakv.h" "$ver_h" "$tmp/headers/"

# Deterministic dump: no paths of this checkout, hashed type ids.
dump() { abidw --no-corpus-path --short-locs --no-comp-dir-path --no-elf-needed \
               --type-id-style hash --out-file "$2" "$1"; }

if [ $update = 1 ]; then
  dump "$lib" "$tmp/cur.abi"
  mkdir -p "$(dirname "$baseline")"
  gzip -n -9 -c "$tmp/cur.abi" > "$baseline"
  echo "abi-check: wrote $baseline from $lib; commit it"
  exit 0
fi
[ -f "$baseline" ] || {
  echo "abi-check: FAIL no baseline $baseline (ABI $abi): run tools/abi-check.sh --update $build" >&2
  exit 1; }
gzip -dc "$baseline" > "$tmp/base.abi"

diff_rc=0
abidiff --hd1 "$tmp/headers" --hd2 "$tmp/headers" "$tmp/base.abi" "$lib" > "$tmp/report" || diff_rc=$?
cat "$tmp/report"
if [ $((diff_rc & 3)) -ne 0 ]; then
  echo "abi-check: FAIL abidiff could not compare (exit $diff_rc)" >&2
  exit 1
fi

# Negative control: a library exporting one qsakv_ function only is incompatible.
printf 'int qsakv_version(void) { return 0; }\n' > "$tmp/stub.c"
${CC:-cc} -shared -fPIC -g -Wl,-soname,libqsakv.so.$abi -o "$tmp/libstub.so" "$tmp/stub.c"
ctl_rc=0
abidiff --hd1 "$tmp/headers" "$tmp/base.abi" "$tmp/libstub.so" > /dev/null || ctl_rc=$?
if [ $((ctl_rc & 8)) -eq 0 ]; then
  echo "abi-check: FAIL the negative control (a stub lacking the API) was not reported as" \
       "incompatible (abidiff exit $ctl_rc): the guard cannot detect anything" >&2
  exit 1
fi
echo "abi-check: negative control reported incompatible, as it must (abidiff exit $ctl_rc)"

# Any Removed or Changed count other than 0 in abidiff's summaries fails.
if grep -Eq '(^|[ ,])[1-9][0-9]* (Removed|Changed)' "$tmp/report"; then
  kind="changed"
  [ $((diff_rc & 8)) -ne 0 ] && kind="INCOMPATIBLE (abidiff)"
  echo "abi-check: FAIL the public ABI $kind against $baseline (see the report above)." \
       "If intended: bump QSAKV_ABI_VERSION when old callers break, then" \
       "tools/abi-check.sh --update $build and commit the baseline." >&2
  exit 1
fi
if [ $diff_rc -ne 0 ]; then
  echo "abi-check: PASS with additions only; note: run tools/abi-check.sh --update $build" \
       "so that the baseline covers them"
else
  echo "abi-check: PASS the public ABI equals $baseline"
fi
