#!/usr/bin/env bash
# One device call (session of 2026-12-05; the held/README.md plan's first steps): the beside
# builds of held/experiment-run.sh (niced) while the tree builds and the selection suite runs
# under compute-sanitizer (run 44's landed top-k: memcheck and racecheck, each sort); then
# the experiment's benches in what time is left. Run from the held/filter branch.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
mkdir -p /tmp/beside; (OUT=/tmp/beside nice -n 10 bash held/experiment-run.sh build > /tmp/beside/beside.txt 2>&1) &
ONLY_SAN=1 SAN_SUITES=test_select SAN_SECONDS=${SAN_SECONDS:-300} bash tools/device-validate.sh > /dev/null 2>&1
echo "== sanitizer done [$(($(date +%s) - T0)) s]"
grep -E "rc=|skipped" $OUT/all.log | grep -v "rc=0 .*ERROR SUMMARY: 0 errors\|rc=0 .*RACECHECK SUMMARY: 0 hazards" | head -40
echo "== runs: $(grep -c 'rc=' $OUT/all.log), clean: $(grep -cE 'rc=0 .*(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' $OUT/all.log)"
wait
cat /tmp/beside/beside.txt; tar czf "$OUT/beside-logs.tgz" -C /tmp/beside .
ROUND2_BEFORE=$((480 - ($(date +%s) - T0))) PROFILE_BEFORE=0 timeout $((590 - ($(date +%s) - T0))) bash held/experiment-run.sh 2>&1 | tail -100
