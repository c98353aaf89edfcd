#!/usr/bin/env bash
# Inside the VM (tests/vm/stripe.sh boots it): the stripe layout's scenarios
# (examples/stripe_vm.rs) against the driver, on 4 throttled pool NVMe drives
# (serials pool0..pool3, one controller each) and a foreign md RAID0 over the two
# namespaces of controller "foreign", assembled before the driver starts.
set -uo pipefail
OUT=$1; BIN=$2; MDADM_DIR=$3
export PATH="$MDADM_DIR:/usr/sbin:/sbin:$PATH"
W=/run/gds
mkdir -p "$W" && mount -t tmpfs tmpfs "$W" && mkdir -p "$W/state"
modprobe nvme; modprobe md_mod; modprobe raid0
for _ in $(seq 1 100); do [ "$(ls -d /sys/block/nvme* 2>/dev/null | wc -l)" -ge 6 ] && break; sleep 0.1; done
ctrl_of() { for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/serial" | tr -d ' ')" = "$1" ] && basename "$c"; done; }
F=$(ctrl_of foreign)
mdadm --create /dev/md/foreign --level=0 --raid-devices=2 --metadata=1.2 --run "/dev/${F}n1" "/dev/${F}n2" >"$OUT/foreign-create.log" 2>&1
FOREIGN_UUID=$(cat /sys/block/md*/md/uuid | head -1)
echo "foreign array $FOREIGN_UUID on /dev/${F}n1 /dev/${F}n2"
"$BIN/gds-csi" serve --endpoint "unix://$W/csi.sock" --mode all --node-id vm-node \
  --state-dir "$W/state" --allowed-path-root "$W" --nvme-discover \
  --mount-timeout 20s --command-timeout 60s --log-format text >"$OUT/driver.log" 2>&1 &
DRIVER=$!
DETACH="echo 1 > /sys/class/nvme/$(ctrl_of pool3)/device/remove"
start=$SECONDS
timeout 300 "$BIN/examples/stripe_vm" "$W/csi.sock" "$W" "$DETACH" "$FOREIGN_UUID" 2>&1 | tee "$OUT/scenarios.log"
rc=${PIPESTATUS[0]}
echo "scenarios: $((SECONDS - start)) s, rc=$rc"
kill -9 $DRIVER 2>/dev/null
exit $rc
