#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, npm, pinned in .ci/run)
# in client mode against `keel mcp test-client`. Every scenario listed in
# .ci/mcp-conformance-passing.txt must pass; the script fails when one does not (and prints the
# others' results for information).
#
# Usage: .ci/mcp-conformance.sh path/to/keel   (MCP_DIR: where .ci/run installed the servers)
set -euo pipefail
cd "$(dirname "$0")/.."
keel="$(realpath "${1:?usage: .ci/mcp-conformance.sh path/to/keel}")"
dir="${MCP_DIR:-$HOME/.cache/keel-ci/mcp}"
node="$dir/node_modules/.bin/node"   # Node 22 (npm package `node`): the suite needs it
suite="$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[ -x "$node" ] && [ -f "$suite" ] || { echo ".ci/mcp-conformance.sh: run .ci/run first (installs the suite into $dir)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The client scenarios are of the session-based revisions (2025-06-18, 2025-11-25).
client="$keel --workspace $work mcp test-client --protocol session"
failed=()
while read -r scenario; do
  [ -z "$scenario" ] || [ "${scenario#\#}" != "$scenario" ] && continue
  if "$node" "$suite" client --command "$client" --scenario "$scenario" --timeout 30000 >"$work/$(echo "$scenario" | tr / _).log" 2>&1; then
    echo "mcp conformance: $scenario: passed"
  else
    echo "mcp conformance: $scenario: FAILED (it passed before; log below)"
    cat "$work/$(echo "$scenario" | tr / _).log"
    failed+=("$scenario")
  fi
done < .ci/mcp-conformance-passing.txt
if [ "${#failed[@]}" -gt 0 ]; then
  echo "mcp conformance: ${#failed[@]} scenario(s) stopped passing: ${failed[*]}" >&2
  exit 1
fi
