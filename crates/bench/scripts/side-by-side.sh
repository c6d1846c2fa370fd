#!/usr/bin/env bash
# Runs the same sluice-bench commands against Sluice and nostr-rs-relay, one
# relay at a time on the same machine, each on a fresh store. Writes every
# report (JSON and the printed summary) under $OUT. See docs/benchmarks.md.
#
#   NRR=/path/to/nostr-rs-relay OUT=/tmp/sbs crates/bench/scripts/side-by-side.sh
#
# Needs `cargo build --release -p sluice -p sluice-bench` first. Optional:
# EVENTS (default 100000), PHASE_SECS (overload, default 10), ONLY (sluice|nrr),
# STEPS (default "basic overload": publish/query/fanout/connections, overload).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
B=${BENCH:-$ROOT/target/release/sluice-bench}
NRR=${NRR:?set NRR to the nostr-rs-relay binary}
OUT=${OUT:-/tmp/side-by-side}
EVENTS=${EVENTS:-100000}
PHASE_SECS=${PHASE_SECS:-10}
STEPS=${STEPS:-basic overload}
mkdir -p "$OUT"
FILE=$OUT/events.jsonl
[ -s "$FILE" ] || "$B" gen --count "$EVENTS" --seed 1 --out "$FILE"

PID=
stop() { [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; PID=; }
trap stop EXIT

wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "relay on port $1 did not start" >&2; exit 1
}

start_sluice() { # $1 port, $2 store dir
  # Per-client limits raised: the bench plays many clients from few loopback
  # addresses, which the per-IP and per-author buckets would otherwise cut
  # to 20 and 10 events/s. The global controllers stay on (enforce).
  SLUICE_SERVER__LISTEN=127.0.0.1:$1 SLUICE_STORE__PATH=$2 \
  SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP=100000 \
  SLUICE_THROTTLE__TARGET_MEMORY_MB=512 SLUICE_LOG__LEVEL=warn \
    "$SLUICE" serve >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

start_nrr() { # $1 port, $2 data dir
  mkdir -p "$2"
  cat >"$2.toml" <<T
[database]
data_directory = "$2"
[network]
address = "127.0.0.1"
port = $1
T
  RUST_LOG=warn "$NRR" --config "$2.toml" >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

run() { # $1 relay name, $2 command name, rest: sluice-bench args
  local name=$1 cmd=$2; shift 2
  echo "== $name $cmd"
  "$B" "$cmd" "$@" --json "$OUT/$name-$cmd.json" | tee "$OUT/$name-$cmd.txt"
}

suite() { # $1 name, $2 start function, $3 port, $4 extra overload flags
  local name=$1 start=$2 port=$3 url=ws://127.0.0.1:$3
  local dir=$OUT/$name-store
  if [[ " $STEPS " == *" basic "* ]]; then
    rm -rf "$dir" "$dir.log"
    $start "$port" "$dir"
    run "$name" publish "$url" --events "$FILE" --connections 8 --window 16
    run "$name" query "$url" --events "$FILE" --connections 4 --duration-secs 20
    run "$name" fanout "$url" --subscribers 200 --publishers 2 --rate 200 --duration-secs 20
    run "$name" connections "$url" --count 1000 --subscribe --source-ips 16 --pid "$PID"
    stop
  fi
  if [[ " $STEPS " == *" overload "* ]]; then
    # A fresh store; capacity measured by the tool first (closed loop).
    rm -rf "$dir"
    $start "$port" "$dir"
    run "$name" overload "$url" --phases 0.5,1,2,5,1 --phase-secs "$PHASE_SECS" --pid "$PID" $4
    stop
  fi
}

if [ "${ONLY:-}" != nrr ]; then suite sluice start_sluice 7811 ""; fi
if [ "${ONLY:-}" != sluice ]; then suite nrr start_nrr 7812 "--no-metrics"; fi
echo "reports in $OUT"
