#!/usr/bin/env bash
# The chart's Grafana dashboard against a real Prometheus scraping a running driver: the
# driver on a loop-device pool with its metrics endpoint, Debian's Prometheus scraping it
# every second (target label node, as the chart's monitors set it), examples/dashboard_load.rs
# driving real CSI calls (a whole-device raw block volume, a filesystem volume, its clone,
# a refused clone, refused calls) in two rounds so that every counter moves after the first
# scrape. Then every query of deploy/helm/gds-csi/dashboards/gds-csi.json, template variables
# substituted as Grafana would, goes through Prometheus' HTTP API: each must parse and return
# a series with a value (tests/e2e/dashboard.py lists the few that cannot exist here, and
# why). No GPU here: nvidia-fs's counters are read from a fixture stats file that grows while
# Prometheus scrapes. DASHBOARD_PNG=FILE also renders the dashboard (query_range, headless
# chromium) into FILE. GDS_CSI_BIN_DIR=DIR uses gds-csi and examples/dashboard_load from DIR
# instead of building them.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(cd "$(dirname "$0")/../.." && pwd)/scripts/lib.sh"
need_root
install_host_tools
start=$SECONDS
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
if [ -n "${DASHBOARD_PNG:-}" ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -n "${GDS_CSI_BIN_DIR:-}" ]; then
  GDS_CSI=$GDS_CSI_BIN_DIR/gds-csi
  LOAD=$GDS_CSI_BIN_DIR/examples/dashboard_load
else
  build_driver
  (cd "$REPO_ROOT" && cargo build --release --quiet --example dashboard_load)
  LOAD=$REPO_ROOT/target/release/examples/dashboard_load
fi
DASHBOARD=$REPO_ROOT/deploy/helm/gds-csi/dashboards/gds-csi.json
# Loopback ports clear of the e2e rigs' (64430-64453).
METRICS=127.0.0.1:64470
PROM=127.0.0.1:64471
NODE=dash-node

start_workdir dashboard
PROM_PID=
BUMP_PID=
cleanup() {
  local p
  for p in "$BUMP_PID" "$PROM_PID"; do
    [ -z "$p" ] || { kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }
  done
  stop_driver_and_clean
}
trap cleanup EXIT

# nvidia-fs's stats file as the kernel module writes it, its counters growing each second
# (written aside and renamed, so a scrape never reads half a file).
nvfs=$WORK/host-proc/driver/nvidia-fs
mkdir -p "$nvfs"
write_stats() {
  printf '%s\n' "GDS Version: 1.10.0.4" "NVFS statistics(ver: 4.0)" "NVFS Driver(version: 2.20.5)" \
    "Mellanox PeerDirect Supported: False" "IO stats: Enabled, peer IO stats: Disabled" "Logging level: info" "" \
    "Active Shadow-Buffer (MiB): 0" "Active Process: 2" \
    "Reads				: n=$((120 * $1)) ok=$((120 * $1 - $1 / 4)) err=$(($1 / 4)) readMiB=$((4096 * $1)) io_state_err=0" \
    "Reads				: Bandwidth(MiB/s)=4096 Avg-Latency(usec)=380" \
    "Writes				: n=$((7 * $1)) ok=$((7 * $1)) err=0 writeMiB=$((640 * $1)) io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0" \
    >"$nvfs/stats.new"
  mv "$nvfs/stats.new" "$nvfs/stats"
}
write_stats 1
(i=1; while :; do sleep 1; i=$((i + 1)); write_stats "$i"; done) &
BUMP_PID=$!

pool=()
for dev_size in 64M 64M 128M 256M 256M 512M; do
  pool+=(--pool-device "$(make_loop "$WORK/dev-$((${#pool[@]} / 2))-$dev_size.img" "$dev_size")")
done
# (The two rounds fill all but the 512M one, which stays free: both layouts take the
# smallest device that fits.)
# A device holding another system's partition table: the pool counts it unavailable and the
# partition layout passes it over (reason foreign) each time it picks where to carve.
foreign=$(make_loop "$WORK/dev-foreign.img" 64M)
printf 'label: gpt\n,16M\n' | sfdisk -q "$foreign"
pool+=(--pool-device "$foreign")
"$GDS_CSI" serve --endpoint "unix://$WORK/csi.sock" --mode all --node-id "$NODE" \
  --state-dir "$WORK/state" --allowed-path-root "$WORK/kubelet" --host-proc "$WORK/host-proc" \
  --metrics-address "$METRICS" "${pool[@]}" 2>"$WORK/driver.log" &
# shellcheck disable=SC2034 # stop_driver_and_clean (scripts/lib.sh) stops it
DRIVER_PID=$!

mkdir -p "$WORK/prom"
cat >"$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gds-csi
    static_configs: [{targets: ["$METRICS"], labels: {node: $NODE}}]
YAML
prometheus --config.file "$WORK/prometheus.yml" --storage.tsdb.path "$WORK/prom" \
  --web.listen-address "$PROM" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!

fail() {
  echo "FAIL - $1"
  for log in driver prometheus; do echo "--- $log log (tail) ---"; tail -20 "$WORK/$log.log"; done
  exit 1
}
# value_of QUERY: the first sample's value of an instant query ("" when none).
value_of() {
  curl -fsS --max-time 5 "http://$PROM/api/v1/query" --data-urlencode "query=$1" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
at_least() { # at_least QUERY N: the query's value has reached N
  local v; v=$(value_of "$1") || return 1
  [ -n "$v" ] && python3 -c 'import sys; sys.exit(float(sys.argv[1]) < float(sys.argv[2]))' "$v" "$2"
}
poll() { # poll SECONDS WHAT COMMAND...
  local secs=$1 deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$what within $secs s"
    sleep 0.5
  done
  echo "ok   - $what"
}

poll 60 "the driver answers Probe ready" "$GDS_CSI" probe --endpoint "unix://$WORK/csi.sock" --timeout 2s
poll 30 "Prometheus scrapes the driver" at_least "up{job=\"gds-csi\"}" 1
for round in 1 2; do
  "$LOAD" "$WORK/csi.sock" "$WORK" "$round" || fail "CSI calls, round $round"
  poll 30 "Prometheus has scraped round $round" \
    at_least "gds_csi_grpc_requests_total{method=\"ListVolumes\"}" "$round"
done
prom_started=$(python3 -c 'import sys,os; print(os.stat(sys.argv[1]).st_mtime)' "$WORK/prometheus.yml")
python3 "$REPO_ROOT/tests/e2e/dashboard.py" check --prometheus "http://$PROM" --dashboard "$DASHBOARD" \
  --deadline 30 || fail "dashboard queries"
if [ -n "${DASHBOARD_PNG:-}" ]; then
  # The last calls' rates have a sample or two yet: let five more scrapes land.
  scrapes='count_over_time(up{job="gds-csi"}[10m])'
  poll 30 "five more scrapes for the rendering" at_least "$scrapes" $(($(value_of "$scrapes") + 5))
  size=$(python3 "$REPO_ROOT/tests/e2e/dashboard.py" render --prometheus "http://$PROM" --dashboard "$DASHBOARD" \
    --since "$prom_started" --html "$WORK/dashboard.html") || fail "dashboard rendering"
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="$size" --screenshot="$DASHBOARD_PNG" "file://$WORK/dashboard.html" >"$WORK/chromium.log" 2>&1 ||
    { cat "$WORK/chromium.log"; fail "chromium screenshot"; }
  echo "ok   - rendered into $DASHBOARD_PNG"
fi
echo "dashboard test: $((SECONDS - start)) s wall"
