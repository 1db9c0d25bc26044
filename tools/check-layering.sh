#!/usr/bin/env bash
# The dependency direction of the tree: kernels/ (CUDA kernels, codecs, parameter
# structs, shared by both backends) includes nothing from src/ (the library that uses
# them). Prints each offending include; exits 1 if there is one.
set -uo pipefail
cd "$(dirname "$0")/.."
bad=0
# Every quoted include under kernels/ must resolve inside kernels/ or include/.
while IFS=: read -r file line inc; do
  name=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$inc")
  dir=$(dirname "$file")
  if [ -e "$dir/$name" ] || [ -e "kernels/$name" ] || [ -e "include/$name" ] ||
     [ "$name" = qsakv_version.h ]; then
    continue
  fi
  echo "check-layering: $file:$line includes \"$name\", which is not under kernels/ or include/"
  bad=1
done < <(grep -rn '#include "' kernels/ --include='*.cu' --include='*.cuh' --include='*.hpp' --include='*.h')
if [ $bad -eq 0 ]; then
  echo "check-layering: kernels/ includes only kernels/ and include/ headers"
fi
exit $bad
