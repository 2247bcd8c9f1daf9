#!/usr/bin/env bash
# Tests the HTTP API with a client nobody here wrote: schemathesis (PyPI, pinned in .ci/run)
# against a started `keel serve` on a fresh SQLite store, reading the server's own
# /openapi.json — every operation, `--checks all`, all four phases (examples, coverage,
# fuzzing, stateful), KEEL_SCHEMATHESIS_EXAMPLES (default 50) examples per operation, the seed
# printed (KEEL_SCHEMATHESIS_SEED replays a run). The requests carry a tenant admin key, so
# operations of system keys answer 403 (documented); .ci/schemathesis.toml says which statuses
# a schema-valid request may get beyond the defaults, and why.
#
# Usage: .ci/schemathesis.sh [KEEL_BINARY]   (ST=path/to/st overrides the schemathesis command)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
keel=$(realpath "${1:-target/debug/keel}")
st=${ST:-st}
examples=${KEEL_SCHEMATHESIS_EXAMPLES:-50}
seed=${KEEL_SCHEMATHESIS_SEED:-$(( (RANDOM << 15) | RANDOM ))}
tmp=$(mktemp -d /tmp/keel-schemathesis.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export HOME=$tmp/home XDG_CONFIG_HOME=$tmp/home/.config XDG_DATA_HOME=$tmp/home/.local/share
mkdir -p "$XDG_CONFIG_HOME/keel" "$tmp/work"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api_port=$(port); metrics_port=$(port)
cat > "$XDG_CONFIG_HOME/keel/server.toml" <<TOML
[server]
listen = "127.0.0.1:$api_port"
metrics_listen = "127.0.0.1:$metrics_port"
workspace_roots = ["$tmp/work"]
allow_script_models = true
TOML
"$keel" tenants create fuzz >/dev/null
key=$("$keel" keys create --tenant fuzz --name schemathesis --role admin 2>/dev/null)
"$keel" serve >"$tmp/serve.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$api_port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
# Data to reach past 404s: a release on a scripted model (a file on the server) and a few
# workspace directories, offered to the generator for `POST /v1/sessions` bodies; the
# document's links then lead from each session created to every operation on it.
for _ in $(seq 2000); do echo '{"text": "ok"}'; done > "$tmp/script.jsonl"
mkdir -p "$tmp/work/ws1" "$tmp/work/ws2" "$tmp/work/ws3"
release=$(curl -fsS -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
  "http://127.0.0.1:$api_port/v1/releases" \
  -d "{\"name\": \"fuzz\", \"model_route\": [\"script:$tmp/script.jsonl\"], \"tools\": [\"read_file\", \"write_file\"]}" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["release_id"])')
cat "$here/schemathesis.toml" - > "$tmp/schemathesis.toml" <<TOML

[dictionaries.releases]
values = ["$release"]

[dictionaries.workspaces]
values = ["$tmp/work/ws1", "$tmp/work/ws2", "$tmp/work/ws3"]

[parameters]
"body.release_id" = { dictionary = "releases", probability = 0.9 }
"body.workspace" = { dictionary = "workspaces", probability = 0.9 }
TOML
echo "schemathesis: seed $seed, $examples examples per operation, against http://127.0.0.1:$api_port"
status=0
(cd "$here" && "$st" --no-color --config-file "$tmp/schemathesis.toml" run "http://127.0.0.1:$api_port/openapi.json" \
  -H "Authorization: Bearer $key" \
  --checks all \
  --phases examples,coverage,fuzzing,stateful \
  --max-examples "$examples" \
  --seed "$seed") || status=$?
if ! kill -0 "$server" 2>/dev/null; then
  echo "schemathesis: keel serve died during the run; its log:"; cat "$tmp/serve.log"; exit 1
fi
if grep -q "panicked" "$tmp/serve.log"; then
  echo "schemathesis: keel serve panicked; its log:"; cat "$tmp/serve.log"; exit 1
fi
[ "$status" = 0 ] || { echo "schemathesis failed (seed $seed; rerun with KEEL_SCHEMATHESIS_SEED=$seed)"; exit "$status"; }
