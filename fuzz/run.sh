#!/usr/bin/env bash
# Runs every cargo-fuzz target (or those named) for FUZZ_SECONDS each, one after the other, and
# exits non-zero when any target finds a crash, a panic, a timeout or a memory blow-up. Not part of
# the default test run; `cargo test -p keel-fuzz` replays the committed corpora without cargo-fuzz.
#
#   fuzz/run.sh                      # every target, 60 s each
#   FUZZ_SECONDS=600 fuzz/run.sh sse_anthropic shell_analysis
#   FUZZ_MINIMIZE=1 fuzz/run.sh      # also fold what the run found into fuzz/corpus (cargo fuzz cmin)
#
# Environment: FUZZ_SECONDS (default 60) per target; FUZZ_JOBS (default 1) parallel libFuzzer
# workers per target; FUZZ_MINIMIZE=1 to merge new inputs into the committed corpus, minimized.
# Needs cargo-fuzz (installed here, pinned, when missing) and a stable toolchain: RUSTC_BOOTSTRAP=1
# lets stable take the instrumentation flags. Builds with `-O -a` (optimized, debug assertions
# and overflow checks on) and no sanitizer: the workspace forbids `unsafe`, so panics, overflows,
# hangs and memory blow-ups are what a finding is. Crash inputs land in fuzz/artifacts/<target>/;
# after fixing one, copy it to fuzz/regressions/<target>/ so `cargo test` replays it.
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    cargo install cargo-fuzz --version "=$CARGO_FUZZ_VERSION" --locked
fi

all=$(cargo fuzz list)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    read -r -a targets <<<"$(echo $all)"
fi

build=(-O -a -s none)
cargo fuzz build "${build[@]}"

mkdir -p target/logs
failed=()
for t in "${targets[@]}"; do
    fresh="target/new-corpus/$t"
    mkdir -p "$fresh" "artifacts/$t" "corpus/$t"
    log="target/logs/$t.log"
    echo "== $t: ${seconds}s"
    # New inputs go to the first folder (scratch); the committed corpus is read, not written.
    parallel=()
    if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
    if cargo fuzz run "${build[@]}" "$t" "$fresh" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 "${parallel[@]}" \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
        status=ok
    else
        status=FINDING
        failed+=("$t")
    fi
    if [ "$jobs" -gt 1 ]; then cat fuzz-*.log >>"$log" 2>/dev/null || true; rm -f fuzz-*.log; fi
    execs=$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s+=$2} END {print s+0}')
    echo "   $status: $execs executions; log $here/$log"
    if [ "$status" = FINDING ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20 || true
    fi
    if [ "${FUZZ_MINIMIZE:-0}" = 1 ] && [ "$status" = ok ]; then
        merged="target/merged/$t"
        rm -rf "$merged" && mkdir -p "$merged"
        cp "corpus/$t"/* "$fresh"/* "$merged"/ 2>/dev/null || true
        cargo fuzz cmin "${build[@]}" "$t" "$merged" >>"$log" 2>&1
        rm -rf "corpus/$t" && mv "$merged" "corpus/$t"
        echo "   corpus/$t: $(ls "corpus/$t" | wc -l) files, $(cat "corpus/$t"/* | wc -c) bytes"
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "findings in: ${failed[*]} (inputs in $here/artifacts/)"
    exit 1
fi
echo "no findings (${#targets[@]} targets, ${seconds}s each)"
