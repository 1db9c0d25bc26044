#!/usr/bin/env bash
# The stand-in for a suite whose tool was not found when the build was configured
# (qsakv_tool_suite in tests/CMakeLists.txt): reports SKIPPED with the command that
# installs the tool (exit 77, CTest's skip), or fails where every suite is required:
# QSAKV_REQUIRE_ALL_SUITES=1 or CI=true in the environment, or the build configured with
# QSAKV_REQUIRE_ALL_SUITES=ON.
#   tools/missing-tool.sh SUITE TOOLS INSTALL_COMMAND
set -u
suite=$1 tools=$2 install=$3
if [ "${CI:-}" = true ] || [ "${QSAKV_REQUIRE_ALL_SUITES:-0}" = 1 ] ||
   [ "${QSAKV_REQUIRE_ALL_SUITES_CONFIGURED:-OFF}" = ON ]; then
  echo "$suite: FAILED: $tools not found, and every suite is required here" \
       "(CI=true or QSAKV_REQUIRE_ALL_SUITES); install: $install, then reconfigure" >&2
  exit 1
fi
echo "SKIPPED: $suite needs $tools, not found when the build was configured; install: $install," \
     "then reconfigure"
exit 77
