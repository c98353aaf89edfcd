#!/usr/bin/env bash
# Inside the VM (tests/vm/stripe.sh boots it): csi-sanity with `layout: stripe`, then the
# stripe layout's scenarios and fio figures (examples/stripe_vm.rs) against the driver,
# on 4 throttled pool NVMe drives (serials pool0..pool3, one controller each) and a
# foreign md RAID0 over the two namespaces of controller "foreign", assembled before the
# driver starts.
#
#   stripe_guest.sh run OUT_DIR BIN_DIR MDADM_DIR TOOLS_DIR    the whole run
#   stripe_guest.sh kill-driver | kill-driver-tree | start-driver |
#                   cut-create-on | cut-create-off                  for the scenarios
set -uo pipefail
W=/run/gds
STATE=/run/gds-rig     # what the subcommands need: the driver's pid and binary
log() { echo "[guest $(date +%T)] $*"; }

start_driver() {
  local bin before
  bin=$(cat "$STATE/bin")
  before=$(grep -c "pool ready" "$W/driver.log" 2>/dev/null)
  "$bin/gds-csi" serve --endpoint "unix://$W/csi.sock" --mode all --node-id vm-node \
    --state-dir "$W/state" --allowed-path-root "$W" --nvme-discover \
    --mount-timeout 20s --command-timeout 60s --log-format text >>"$W/driver.log" 2>&1 &
  echo $! >"$STATE/driver.pid"
  for _ in $(seq 1 300); do
    [ "$(grep -c "pool ready" "$W/driver.log")" -gt "${before:-0}" ] && [ -S "$W/csi.sock" ] && return 0
    sleep 0.1
  done
  log "driver did not come up"; tail -20 "$W/driver.log"; return 1
}

# kill-driver-tree: the driver and every process under it (mdadm, mkfs), as the death of
# its container would take them all.
kill_driver() {
  local pid; pid=$(cat "$STATE/driver.pid")
  local victims=("$pid")
  if [ "${1:-}" = tree ]; then
    local i=0
    while [ $i -lt ${#victims[@]} ]; do
      # shellcheck disable=SC2207 # pids are words
      victims+=($(cat /proc/"${victims[$i]}"/task/*/children 2>/dev/null))
      i=$((i + 1))
    done
    kill -STOP "${victims[@]}" 2>/dev/null
  fi
  kill -9 "${victims[@]}" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  [ ${#victims[@]} -gt 1 ] && log "killed the driver $pid and ${victims[*]:1}"
  return 0
}

case "${1:-}" in
  cut-create-on) rm -f "$STATE/create-cut"; touch "$STATE/cut-create"; exit ;;
  cut-create-off) rm -f "$STATE/cut-create"; exit ;;
  kill-driver) kill_driver; exit ;;
  kill-driver-tree) kill_driver tree; exit ;;
  start-driver) start_driver; exit ;;
  run) OUT=$2; BIN=$3; MDADM_DIR=$4; TOOLS=$5 ;;
  *) echo "usage: $0 run OUT BIN MDADM_DIR TOOLS | kill-driver | kill-driver-tree | start-driver | cut-create-on | cut-create-off" >&2; exit 2 ;;
esac

export PATH="$MDADM_DIR:$TOOLS:/usr/sbin:/sbin:$PATH"
mkdir -p "$W" "$STATE" && mount -t tmpfs tmpfs "$W" && mount -t tmpfs tmpfs "$STATE" && mkdir -p "$W/state"
echo "$BIN" >"$STATE/bin"
# The driver's mdadm: the real one; while $STATE/cut-create exists, a --create is cut
# short as a node dying mid-create leaves it (every superblock written, the array
# stopped, the last member's superblock cleared), then waits to be killed.
mkdir -p "$STATE/shim"
cat >"$STATE/shim/mdadm" <<EOF
#!/usr/bin/env bash
real=$MDADM_DIR/mdadm
if [ "\${1:-}" = --create ] && [ -e $STATE/cut-create ]; then
  "\$real" "\$@" >&2 || exit
  last=\${!#}
  # No udev here: the array is found by what holds its last member, not by its name.
  md=\$(ls /sys/class/block/\$(basename "\$last")/holders)
  "\$real" --stop "/dev/\$md" >&2 && "\$real" --zero-superblock "\$last" >&2 || exit
  # Which members it was given, for the scenario to tamper with.
  members=(); after=
  for a in "\$@"; do [ -n "\$after" ] && members+=("\$a"); [ "\$a" = --run ] && after=1; done
  printf '%s\n' "\${members[@]}" >$STATE/create-cut
  exec sleep 600
fi
exec "\$real" "\$@"
EOF
chmod +x "$STATE/shim/mdadm"
export PATH="$STATE/shim:$PATH"
modprobe nvme; modprobe md_mod; modprobe raid0; modprobe loop
for _ in $(seq 1 100); do [ "$(ls -d /sys/block/nvme* 2>/dev/null | wc -l)" -ge 6 ] && break; sleep 0.1; done
ctrl_of() { for c in /sys/class/nvme/nvme*; do [ "$(tr -d ' ' <"$c/serial")" = "$1" ] && basename "$c"; done; }
F=$(ctrl_of foreign)
mdadm --create /dev/md/foreign --level=0 --raid-devices=2 --metadata=1.2 --run "/dev/${F}n1" "/dev/${F}n2" >"$OUT/foreign-create.log" 2>&1
FOREIGN_UUID=$(cat /sys/block/md*/md/uuid | head -1)
echo "foreign array $FOREIGN_UUID on /dev/${F}n1 /dev/${F}n2"
start_driver || exit 1
fail=0

# csi-sanity with `layout: stripe`, 2 members of 8 MiB. Stripes do not grow yet
# (src/volume/block/expand.rs stripe_fixed): the expansion specs ask for the size they have.
log "csi-sanity: layout: stripe, stripeCount 2"
printf 'gdsPolicy: disabled\nlayout: stripe\nstripeCount: "2"\n' >"$W/stripe-params.yaml"
start=$SECONDS
# The snapshot specs snapshot volumes never staged: a stripe has no device then (its md
# array runs only while staged), so its snapshot is refused (docs/snapshots.md) and they
# are skipped here.
csi-sanity --csi.endpoint "$W/csi.sock" --csi.mountdir "$W/target" --csi.stagingdir "$W/staging" \
  --csi.testvolumesize $((16 << 20)) --csi.testvolumeexpandsize $((16 << 20)) \
  --csi.testvolumeparameters "$W/stripe-params.yaml" -ginkgo.skip '[Ss]napshot' \
  -ginkgo.no-color -ginkgo.v >"$OUT/sanity-stripe.out" 2>&1
rc=$?
echo "csi-sanity stripe: $(grep -E 'Ran [0-9]+ of [0-9]+ Specs' "$OUT/sanity-stripe.out" | tail -1) $(grep -E '^(SUCCESS|FAIL)!' "$OUT/sanity-stripe.out" | tail -1) ($((SECONDS - start)) s)" | tee "$OUT/sanity.summary"
if [ $rc -ne 0 ]; then grep -E "^\s*\[FAIL\]" "$OUT/sanity-stripe.out" | sort -u | head -20; fail=1; fi
left=$(ls -d /sys/block/md* | wc -l)
[ "$left" -eq 1 ] || { echo "csi-sanity left $((left - 1)) md arrays running"; fail=1; }

DETACH="echo 1 > /sys/class/nvme/$(ctrl_of pool3)/device/remove"
log "scenarios"
start=$SECONDS
# About 9 minutes on an idle 2-core host, twice that while the host builds (TCG shares its
# cores); the chunk comparison adds a stripe per chunk and 18 fio runs each.
limit=1200; [ -n "${FIO_CHUNKS:-}" ] && limit=1500
FIO_CHUNKS="${FIO_CHUNKS:-}" GUEST_HELPER="${BASH_SOURCE[0]}" timeout "$limit" "$BIN/examples/stripe_vm" "$W/csi.sock" "$W" "$DETACH" "$FOREIGN_UUID" 2>&1 | tee "$OUT/scenarios.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
echo "scenarios: $((SECONDS - start)) s"
cp "$W/driver.log" "$OUT/driver.log"
kill_driver
log "guest done: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
