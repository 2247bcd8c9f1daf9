#!/usr/bin/env python3
"""The peers' stdlib floor (`../shared/peers/mini_agent.py`) plus Keel's durability rule.

For the HTTP row of issue 16: what any runtime that keeps Keel's promise costs at the least.
It is the floor's loop — streaming Chat Completions to $FAKE_BASE_URL over one keep-alive
connection, each `shell` call run with `/bin/bash -c`, stop at the first plain answer — with
the two durable commits per side-effecting call that Keel's journal must make
(docs/ARCHITECTURE.md, "effects"): the call's intent is committed before the command runs and
its outcome after, each a SQLite transaction in WAL mode with `synchronous=FULL` (the store's
settings: one `fsync` of the WAL a commit), in a file in the run's directory. Nothing else:
no redaction, policy, journal projection, events or sandbox.

Run it in the peers' harness beside Keel:
    ../shared/peers/run_bench.sh ... --custom "durable-floor=python3 $PWD/docs/bench/durable_floor_agent.py"
Keel's marginal ms a step minus this agent's is Keel's own cost above the durability floor.
"""
import http.client
import json
import os
import sqlite3
import subprocess
import sys
import urllib.parse

base = urllib.parse.urlparse(os.environ.get("FAKE_BASE_URL", "http://127.0.0.1:18080"))
conn = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
db = sqlite3.connect(os.path.join(os.getcwd(), ".durable-floor.db"), isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS effects (id TEXT PRIMARY KEY, args TEXT, status TEXT, outcome TEXT)")
tools = [{"type": "function", "function": {"name": "shell", "description": "run a shell command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}}]
msgs = [{"role": "user", "content": sys.argv[1] if len(sys.argv) > 1 else "run the steps"}]
n_tools = 0
while True:
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "fake", "stream": True, "messages": msgs, "tools": tools}),
        {"Content-Type": "application/json", "Authorization": "Bearer dummy"})
    raw = conn.getresponse().read().decode()
    text, calls = "", {}
    for line in raw.split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            d = ch["delta"]
            text += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                e = calls.setdefault(tc["index"], {"id": None, "name": None, "args": ""})
                e["id"] = tc.get("id") or e["id"]
                e["name"] = tc.get("function", {}).get("name") or e["name"]
                e["args"] += tc.get("function", {}).get("arguments") or ""
    if not calls:
        print(json.dumps({"summary": {"tool_calls": n_tools, "final": text}}))
        break
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
        for c in calls.values()]})
    for c in calls.values():
        cmd = json.loads(c["args"])["command"]
        # The intent, durable before the command runs.
        db.execute("BEGIN")
        db.execute("INSERT OR REPLACE INTO effects VALUES (?, ?, 'dispatched', NULL)",
                   (c["id"], c["args"]))
        db.execute("COMMIT")
        p = subprocess.run(["/bin/bash", "-c", cmd], capture_output=True, text=True)
        out = "exit=%d\n%s%s" % (p.returncode, p.stdout, p.stderr)
        # The outcome, durable before the model sees it.
        db.execute("BEGIN")
        db.execute("UPDATE effects SET status = 'succeeded', outcome = ? WHERE id = ?", (out, c["id"]))
        db.execute("COMMIT")
        n_tools += 1
        print(json.dumps({"tool": c["name"], "command": cmd, "exit": p.returncode}), flush=True)
        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": out})
