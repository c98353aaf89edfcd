#!/usr/bin/env bash
# Which source files a plain block NodeStage runs through, measured rather than read: a
# kernel uprobe on every gds-csi function of the debug binary (tracefs, monotonic clock),
# the ignored test `stage_trace_windows` (tests/block_root.rs) stages one fresh volume
# (mkfs included) and then idles as long, and each function hit inside the stage window
# and not in the idle window is mapped to its file by the binary's line table. Needs root.
# Prints the files (functions per file) and the totals; target/stage-trace/ keeps the
# raw hits and each function by file.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
need_root
install_host_tools
tracefs=/sys/kernel/tracing
mountpoint -q $tracefs || mount -t tracefs nodev $tracefs

cargo build --quiet --bin gds-csi --test block_root
bin=$(readlink -f target/debug/gds-csi)
work=target/stage-trace
rm -rf "$work" && mkdir -p "$work"
cleanup() {
  echo 0 >$tracefs/tracing_on
  if [ -d $tracefs/events/gdstrace ]; then
    echo 0 >$tracefs/events/gdstrace/enable
    grep '^p:gdstrace/' $tracefs/uprobe_events | cut -d' ' -f1 | sed 's/^p:/-:/' \
      >"$work/remove"
    while read -r probe; do echo "$probe" >>$tracefs/uprobe_events; done <"$work/remove"
  fi
  echo local >$tracefs/trace_clock
}
trap cleanup EXIT
# One probe per function of this crate (its own paths and its trait impls), at the
# function's file offset in the executable segment.
python3 tools/stage-trace.py probes "$bin" >"$work/probes"
echo 0 >$tracefs/tracing_on
echo mono >$tracefs/trace_clock
echo 65536 >$tracefs/buffer_size_kb
echo >$tracefs/trace
# One definition per write: the kernel refuses a buffer of many.
while read -r probe; do echo "$probe" >>$tracefs/uprobe_events; done <"$work/probes"
echo 1 >$tracefs/events/gdstrace/enable
echo 1 >$tracefs/tracing_on
cargo test --quiet --test block_root stage_trace_windows -- --ignored --nocapture \
  >"$work/test.out" 2>&1 || { cat "$work/test.out"; exit 1; }
echo 0 >$tracefs/tracing_on
cat $tracefs/trace >"$work/hits"
python3 tools/stage-trace.py files "$bin" "$work/hits" "$work/test.out"
