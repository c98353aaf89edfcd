#!/usr/bin/env bash
# Bounded fuzzing of every parser (the cargo-fuzz project in fuzz/): installs the nightly
# toolchain and cargo-fuzz when missing, builds the targets, runs each one for
# FUZZ_SECONDS (default 20) from its committed seed corpus, and prints executions and
# crashes per target. New corpus entries go to a scratch directory, so the committed
# seeds stay as they are; crash inputs are copied to fuzz/artifacts/<target>/ (ignored
# by git) with the command that reproduces them. Exit status 1 when any target crashed.
# FUZZ_DEV=1 builds the targets unoptimized, with overflow checks (cargo fuzz --dev): a
# short run's build then takes a fraction of the time, for fewer executions a second.
#   FUZZ_SECONDS=60 FUZZ_TARGETS="mountinfo request" bash scripts/fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
# Outside the checkout, so a fresh clone on the same machine (CI) reuses the long first build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gds-csi/fuzz-target}"
seconds=${FUZZ_SECONDS:-20}
read -r -a targets <<<"${FUZZ_TARGETS:-mountinfo nvfs_procfs cufile_json volume_id request gpt_label}"

if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install rustup (https://rustup.rs) first" >&2
  exit 2
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal || exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked || exit 2
fi
mode=()
[ "${FUZZ_DEV:-0}" = 1 ] && mode=(--dev)
cargo +nightly fuzz build "${mode[@]}" || exit 2

work=$(mktemp -d /tmp/gds-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
total_execs=0
total_crashes=0
printf '%-12s | %12s | %7s | %s\n' target executions crashes seconds
printf '%s\n' "-------------|--------------|---------|--------"
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  start=$SECONDS
  cargo +nightly fuzz run "${mode[@]}" "$t" "$work/corpus/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$t/" >"$work/$t.log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$' | tail -1)
  [ -n "$execs" ] || execs=$(grep -o '^Done [0-9]* runs' "$work/$t.log" | grep -o '[0-9]*' | tail -1)
  [ -n "$execs" ] || execs=0
  crashes=$(find "$work/artifacts/$t" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    crashes=1 # died without writing an input (build or setup failure): count it, show the log
    tail -20 "$work/$t.log" >&2
  fi
  if [ "$crashes" -gt 0 ]; then
    mkdir -p "fuzz/artifacts/$t"
    cp "$work/artifacts/$t"/* "fuzz/artifacts/$t/" 2>/dev/null
    grep -m1 -A12 -E 'panicked|ERROR: ' "$work/$t.log" >&2
    for f in "fuzz/artifacts/$t"/*; do echo "  reproduce: cargo +nightly fuzz run ${mode[*]} $t $f" >&2; done
  fi
  printf '%-12s | %12s | %7s | %s\n' "$t" "$execs" "$crashes" "$((SECONDS - start))"
  total_execs=$((total_execs + execs))
  total_crashes=$((total_crashes + crashes))
done
echo "fuzz total: $total_execs executions, $total_crashes crashes over ${#targets[@]} targets"
[ "$total_crashes" -eq 0 ]
