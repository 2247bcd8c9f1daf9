#!/usr/bin/env python3
"""The sandbox's cost per `shell` call, keel builds side by side (docs/BENCHMARKS.md).

    python3 docs/bench/sandbox_per_call.py script ROUNDS KEEL [KEEL ...]
    python3 docs/bench/sandbox_per_call.py http ROUNDS KEEL [KEEL ...]

`script`: `keel run --model script:…` with 100 `shell` calls of `true` then `done`; the
`result` line's `duration_ms`. `http`: `keel run --model openai:fake` against the peers'
fake model server (`../shared/peers/fake_llm_server.py --steps 200`: 199 `shell` calls), the
process timed from outside. Each round runs every KEEL with the default sandbox and with
`--sandbox off`, alternating, each run with a fresh workspace (a git repository under /tmp, as
the peers' harness makes) and a fresh HOME. Prints, per KEEL, the medians and
(median with − median without) / calls. Keep each `keel` beside its `keel-sandbox-launcher`
(a copy, never a hard link: keel refuses a launcher with two names and runs itself instead).
Stdlib only.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/peers")
PORT = 18080


def one_run(kind, keel, mode, script):
    ws = tempfile.mkdtemp(dir="/tmp")
    home = tempfile.mkdtemp(dir="/var/tmp")
    subprocess.run(["git", "init", "-q", ws], check=True)
    try:
        args = [keel, "run", "--permission-mode", "bypass", "--output", "jsonl",
                "--max-steps", "1000", "--workspace", ws]
        if kind == "script":
            args += ["--model", "script:" + script]
        else:
            args += ["--model", "openai:fake", "--base-url", f"http://127.0.0.1:{PORT}/v1"]
        if mode == "off":
            args += ["--sandbox", "off"]
        args += ["run the steps"]
        env = dict(os.environ, HOME=home, OPENAI_API_KEY="dummy")
        start = time.perf_counter()
        p = subprocess.run(args, capture_output=True, text=True, env=env,
                           stdin=subprocess.DEVNULL)
        wall = (time.perf_counter() - start) * 1000
        result = None
        for line in p.stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "result":
                result = event
        if p.returncode != 0 or result is None:
            sys.exit(f"{keel} ({mode}) failed: exit {p.returncode}\n{p.stderr[-2000:]}")
        return result["duration_ms"] if kind == "script" else wall
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("script", "http"):
        sys.exit(__doc__)
    kind, rounds, keels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    calls = 100 if kind == "script" else 199
    script = None
    server = None
    if kind == "script":
        fd, script = tempfile.mkstemp(suffix=".jsonl")
        with os.fdopen(fd, "w") as f:
            for _ in range(calls):
                call = {"name": "shell", "arguments": {"command": "true"}}
                f.write(json.dumps({"text": "", "tool_calls": [call]}) + "\n")
            f.write(json.dumps({"text": "done"}) + "\n")
    else:
        server = subprocess.Popen(
            [sys.executable, os.path.join(PEERS, "fake_llm_server.py"), "--port", str(PORT),
             "--steps", str(calls + 1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    times = {}
    try:
        for _ in range(rounds):
            for keel in keels:
                for mode in ("default", "off"):
                    times.setdefault((keel, mode), []).append(one_run(kind, keel, mode, script))
    finally:
        if server:
            server.kill()
        if script:
            os.unlink(script)
    for keel in keels:
        on = statistics.median(times[(keel, "default")])
        off = statistics.median(times[(keel, "off")])
        print(f"{keel}: default {on:.1f} ms, off {off:.1f} ms, "
              f"sandbox per shell call {(on - off) / calls:.2f} ms ({rounds} rounds)")


if __name__ == "__main__":
    main()
