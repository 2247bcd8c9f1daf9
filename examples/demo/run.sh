#!/usr/bin/env bash
# Keel's demo: builds keel and runs its coding agent on a fresh copy of workspace/ with the
# scripted model in script.jsonl — no API key, no services; the session is stored in embedded
# SQLite under $XDG_DATA_HOME/keel (~/.local/share/keel). Extra arguments go to `keel run`,
# e.g. `examples/demo/run.sh --output jsonl`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ws=$(mktemp -d "${TMPDIR:-/tmp}/keel-demo.XXXXXX")
cp -R "$here/workspace/." "$ws/"
echo "workspace: $ws" >&2
cargo run -q --manifest-path "$here/../../Cargo.toml" -p keel -- \
  run --workspace "$ws" --model "script:$here/script.jsonl" --permission-mode bypass "$@" \
  "Fix the failing test in this project."
