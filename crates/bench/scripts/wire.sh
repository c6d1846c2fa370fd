#!/usr/bin/env bash
# Bytes on the wire and relay CPU per served event (docs/benchmarks.md#bytes-on-the-wire):
# a Sluice build from before permessage-deflate, the new build in each `server.compression`
# mode (and "sliding" at other window sizes), and strfry at its default compression, in one
# sitting, alternating, ROUNDS each, each run on a fresh store.
#
#   crates/bench/scripts/wire.sh BASE_BIN_DIR NEW_BIN_DIR EVENTS.jsonl [ROUNDS] [OUT]
#
# BIN_DIRs hold `sluice` (and NEW_BIN_DIR `sluice-bench`). strfry runs when STRFRY (its
# binary) and STRFRY_CONF (its config; port and db are replaced per run) are set. Live: 10
# subscribers, so the relay's CPU per delivery is mostly serving, not ingesting; stored: 5
# rounds asking for every event back. Prints the medians; one JSON per run in OUT.
set -u
B0=$1; B1=$2; EV=$3; N=${4:-2}; OUT=${5:-wire}
BENCH=$B1/sluice-bench
mkdir -p "$OUT"
port=7900
up() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; }
measure() { # label port pid
  "$BENCH" wire "ws://127.0.0.1:$2" --events "$EV" --count 1000000 --subscribers 10 --repeat 5 \
    --relay-pid "$3" --json "$OUT/$1-$2.json" >"$OUT/$1-$2.txt" 2>&1
}
sluice_run() { # label bindir [KEY=VALUE...]
  local label=$1 bin=$2 store pid; shift 2
  port=$((port+1)); store=$(mktemp -d)
  env SLUICE_SERVER__LISTEN=127.0.0.1:$port SLUICE_STORE__PATH="$store/store" SLUICE_THROTTLE__MODE=off \
    SLUICE_LOG__LEVEL=warn "$@" "$bin/sluice" serve >/dev/null 2>&1 &
  pid=$!; up $port
  measure "$label" $port $pid
  kill $pid; wait $pid 2>/dev/null; rm -rf "$store"
}
strfry_run() {
  local dir conf pid
  port=$((port+1)); dir=$(mktemp -d); conf=$dir/strfry.conf
  mkdir -p "$dir/db"
  sed -e "s|^db = .*|db = \"$dir/db/\"|" -e "s|^\( *\)port = .*|\1port = $port|" "$STRFRY_CONF" >"$conf"
  (cd "$(dirname "$STRFRY")" && exec "$STRFRY" --config="$conf" relay --verbosity=WARNING) >/dev/null 2>&1 &
  pid=$!; up $port
  measure strfry $port $pid
  kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
}
for _ in $(seq "$N"); do
  sluice_run base "$B0"
  sluice_run off "$B1" SLUICE_SERVER__COMPRESSION=off
  sluice_run stateless "$B1" SLUICE_SERVER__COMPRESSION=stateless
  sluice_run sliding "$B1"
  sluice_run sliding-1k "$B1" SLUICE_SERVER__COMPRESSION_WINDOW_BYTES=1024
  sluice_run sliding-32k "$B1" SLUICE_SERVER__COMPRESSION_WINDOW_BYTES=32768
  if [ -n "${STRFRY:-}" ]; then strfry_run; fi
done
python3 - "$OUT" <<'PY'
import glob, json, re, statistics, sys
out = sys.argv[1]
labels = ["base", "off", "stateless", "sliding", "sliding-1k", "sliding-32k", "strfry"]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print(f"{'relay':12} {'stored B/ev':>11} {'live B/ev':>9} {'payload':>8} {'stored CPU us':>13} {'live CPU us':>11}  runs")
for label in labels:
    files = [f for f in sorted(glob.glob(f"{out}/{label}-*.json"))
             if re.fullmatch(re.escape(label) + r"-\d+\.json", f.rsplit("/", 1)[-1])]
    runs = [json.load(open(f)) for f in files]
    if not runs:
        continue
    s = [r["stored"]["per_event"]["wire"] for r in runs]
    l = [r["live"]["per_event"]["wire"] for r in runs]
    p = [r["stored"]["per_event"]["payload"] for r in runs]
    sc = [r["stored"].get("relay_cpu_us_per_event") for r in runs]
    lc = [r["live"].get("relay_cpu_us_per_event") for r in runs]
    print(f"{label:12} {med(s):11.1f} {med(l):9.1f} {med(p):8.1f} {med(sc):13.1f} {med(lc):11.1f}  "
          f"{len(runs)} (live CPU {[round(x or 0, 1) for x in lc]}) ext {runs[0].get('extension')}")
PY
