#!/usr/bin/env bash
# Keel's demo: runs keel's coding agent on a fresh copy of workspace/ with the scripted model in
# script.jsonl — no API key, no services; the session is stored in embedded SQLite under
# $XDG_DATA_HOME/keel (~/.local/share/keel). Extra arguments go to `keel run`, e.g.
# `examples/demo/run.sh --output jsonl`.
#
# Which keel: $KEEL if set, else `keel` on PATH (e.g. after `cargo install --locked --path crates/keel`),
# else a debug build of this checkout (a few minutes the first time): `keel` and the sandbox
# launcher beside it, built together (a launcher of another build refuses to run anything).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ws=$(mktemp -d "${TMPDIR:-/tmp}/keel-demo.XXXXXX")
cp -R "$here/workspace/." "$ws/"
echo "workspace: $ws" >&2
if [ -n "${KEEL:-}" ]; then
  keel=("$KEEL")
elif command -v keel >/dev/null 2>&1; then
  keel=("$(command -v keel)")
else
  echo "building keel (debug, with cargo build; a few minutes the first time)" >&2
  manifest="$here/../../Cargo.toml"
  cargo build -q --manifest-path "$manifest" -p keel --bins
  target=$(cargo metadata -q --format-version 1 --no-deps --manifest-path "$manifest" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  keel=("$target/debug/keel")
fi
echo "keel: ${keel[*]}" >&2
"${keel[@]}" run --workspace "$ws" --model "script:$here/script.jsonl" --permission-mode bypass "$@" \
  "Fix the failing test in this project."
