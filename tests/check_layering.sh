#!/usr/bin/env bash
# The layering of src/ (docs/architecture.md), checked on every #include "...":
#   core ← io ← kernels ← backend ← models ← pipeline ← api ← tools/cli, tools/server
# Each folder may include itself, the folders below it and the public headers (klein/); the CLI
# and the server only the public headers. Prints every violation; exits non-zero if there is one.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A allowed=(
  [core]="core klein"
  [io]="io core klein"
  [kernels]="kernels core klein"
  [backend]="backend kernels io core klein"
  [models]="models backend io core klein"
  [pipeline]="pipeline models backend io core klein"
  [api]="api pipeline models backend kernels io core klein"
)
bad=0
for layer in "${!allowed[@]}"; do
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
    top=${inc%%/*}
    [ "$top" = "$inc" ] && continue  # a file beside this one
    ok=0
    for a in ${allowed[$layer]}; do [ "$top" = "$a" ] && ok=1; done
    if [ $ok = 0 ]; then echo "layering: ${file#$root/} includes \"$inc\" (src/$layer may use: ${allowed[$layer]})"; bad=1; fi
  done < <(grep -rHn '#include "' "$root/src/$layer" 2>/dev/null)
done
while IFS= read -r line; do
  inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
  case "$inc" in klein/*|*.h) [[ "$inc" == */* && "$inc" != klein/* ]] && { f=${line%%:*}; echo "layering: ${f#$root/} includes \"$inc\" (the CLI uses the public API only)"; bad=1; } ;; esac
done < <(grep -rHn '#include "' "$root/tools/cli" "$root/tools/server")
[ $bad = 0 ] && echo "layering: ok"
exit $bad
