#!/usr/bin/env bash
# Proves each release-validation scenario can fail (issue 18, "each test must be able to
# fail"): for each (mechanism, tests) pair it runs the tests with the mechanism turned off
# (KEEL_MECHANISM_OFF, the test-only switches of keel-core's src/mechanisms.rs, compiled into
# test builds only) and fails unless that run fails; it first runs each test filter with every
# switch off the table (KEEL_MECHANISM_OFF unset) and fails unless that run passes. Prints a
# table; logs of every run go to target/mechanisms-off/.
#
# Usage:
#   scripts/mechanisms-off.sh                      # the default table below
#   scripts/mechanisms-off.sh fencing:stale_write  # only these pairs (scenario modules)
#   scripts/mechanisms-off.sh 'fencing@keel-store:main:conformance::sqlite::stale'   # any test filter
#
# A pair is MECHANISM:SCENARIO (the filter `release_validation::SCENARIO` of `cargo test -p keel
# --test main`), or MECHANISM@PACKAGE:TARGET:FILTER for any test target (TARGET `lib`: the
# package's unit tests, `cargo test --lib`). Mechanism names: the
# snake_case names of keel_core::mechanisms::Mechanism (an unknown one makes the run panic).
# Needs what the tests need (PostgreSQL at KEEL_TEST_DATABASE_URL, as .ci/run prepares).
set -uo pipefail
cd "$(dirname "$0")/.."

# mechanism:scenario — the scenario whose invariant the mechanism guards.
default_pairs=(
  tenant_scope:tenant_isolation
  fencing:stale_write
  cas_version:stale_write
  idempotency_key:duplicate_delivery
  decision_once:duplicate_delivery
  effect_claim:crash_after_effect
  approval_hash:poisoned_result
  dispatch_hash:approved_arguments
  cancel_before_dispatch:cancellation_race
  budget_check:budget_exhaustion
  queue_bound:queue_overload
  schema_version_check:schema_migration
  fallback:provider_fallback
  # The intent race (an input or cancellation withdrawn after the worker listed it): the store's
  # contract and the runtime's handling of it.
  'intent_consume@keel-store:main:consuming_an_intent'
  'intent_consume@keel-runtime:lib:withdrawn_after_the_workers_list'
)
pairs=("$@")
[ "${#pairs[@]}" -gt 0 ] || pairs=("${default_pairs[@]}")

logs=target/mechanisms-off
mkdir -p "$logs"

# "PACKAGE TARGET FILTER" of a pair's tests.
tests_of() {
  local spec=$1
  if [[ $spec == *@* ]]; then
    local rest=${spec#*@}
    local package=${rest%%:*} rest2=${rest#*:}
    echo "$package ${rest2%%:*} ${rest2#*:}"
  else
    echo "keel main release_validation::${spec#*:}"
  fi
}
mechanism_of() { local spec=$1; spec=${spec%%@*}; echo "${spec%%:*}"; }

# Runs the tests (with KEEL_MECHANISM_OFF=$1 when not empty); prints pass, fail or none (the
# filter matched no test), and leaves the output in $2.
run() {
  local off=$1 log=$2 package=$3 target=$4 filter=$5
  local which=(--test "$target")
  [ "$target" = lib ] && which=(--lib)
  if [ -n "$off" ]; then
    KEEL_MECHANISM_OFF=$off cargo test -q -p "$package" "${which[@]}" -- "$filter" >"$log" 2>&1
  else
    env -u KEEL_MECHANISM_OFF cargo test -q -p "$package" "${which[@]}" -- "$filter" >"$log" 2>&1
  fi
  local rc=$?
  if grep -Eq '^test result: [a-zA-Z]+\. 0 passed; 0 failed' "$log"; then
    echo none
  elif [ "$rc" -eq 0 ]; then
    echo pass
  else
    echo fail
  fi
}

# Build once (the runs below only filter); the switches are in every test build of keel.
targets=$(for p in "${pairs[@]}"; do tests_of "$p" | cut -d' ' -f1,2; done | sort -u)
while read -r package target; do
  which=(--test "$target")
  [ "$target" = lib ] && which=(--lib)
  cargo test -q -p "$package" "${which[@]}" --no-run >"$logs/build.log" 2>&1 || {
    cat "$logs/build.log"
    echo "mechanisms-off: building $package --test $target failed" >&2
    exit 1
  }
done <<<"$targets"

declare -A baseline
bad=0
rows=()
start=$(date +%s)
for p in "${pairs[@]}"; do
  read -r package target filter <<<"$(tests_of "$p")"
  m=$(mechanism_of "$p")
  key="$package $target $filter"
  if [ -z "${baseline[$key]:-}" ]; then
    baseline[$key]=$(run "" "$logs/on-${filter//[:\/]/_}.log" "$package" "$target" "$filter")
  fi
  on=${baseline[$key]}
  t0=$(date +%s)
  off=$(run "$m" "$logs/off-$m-${filter//[:\/]/_}.log" "$package" "$target" "$filter")
  secs=$(( $(date +%s) - t0 ))
  verdict=ok
  if [ "$on" != pass ]; then
    verdict="BAD: $([ "$on" = none ] && echo 'no such tests' || echo 'fails with every mechanism on')"
  elif [ "$off" != fail ]; then
    verdict="BAD: $([ "$off" = none ] && echo 'no such tests' || echo 'passes with the mechanism off (test too weak)')"
  fi
  [ "$verdict" = ok ] || bad=$((bad + 1))
  rows+=("$(printf '%-24s %-52s %-5s %-5s %4ss  %s' "$m" "$package/$target $filter" "$on" "$off" "$secs" "$verdict")")
done

printf '\n%-24s %-52s %-5s %-5s %5s  %s\n' mechanism tests "on" "off" time verdict
printf '%s\n' "${rows[@]}"
echo "mechanisms-off: ${#pairs[@]} pairs, $bad bad, $(( $(date +%s) - start )) s (logs in $logs/)"
[ "$bad" -eq 0 ]
