#!/usr/bin/env bash
# Idle RSS of the node plugin: `gds-csi serve --mode node` with an empty pool, VmRSS read
# 1 s after Probe answers ready (`gds-csi probe`). Runs each given
# binary ROUNDS times (default 5), alternating, and prints each run and the median per
# binary, so an A/B of two builds shares one machine state.
#   tools/idle-rss.sh target/release/gds-csi target/dist/gds-csi
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
rounds=${ROUNDS:-5}
work=$(mktemp -d /tmp/gds-idle-rss.XXXXXX)
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
rss_of() { # BINARY: prints VmRSS in KiB
  rm -rf "$work/state" "$work/csi.sock"
  "$1" serve --mode node --node-id idle-rss --endpoint "unix://$work/csi.sock" \
    --state-dir "$work/state" --allowed-path-root "$work" >"$work/log" 2>&1 &
  pid=$!
  "$1" probe --endpoint "unix://$work/csi.sock" --timeout 30s >/dev/null ||
    { cat "$work/log" >&2; exit 1; }
  sleep 1
  awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
declare -A runs
for _ in $(seq "$rounds"); do
  for bin in "$@"; do runs[$bin]+="$(rss_of "$bin") "; done
done
for bin in "$@"; do
  # shellcheck disable=SC2086 # the runs are words
  median=$(printf '%s\n' ${runs[$bin]} | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  awk -v bin="$bin" -v runs="${runs[$bin]}" -v m="$median" \
    'BEGIN { printf "%s: runs (KiB) %s-> median %.2f MiB\n", bin, runs, m / 1024 }'
done
