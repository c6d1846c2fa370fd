#!/usr/bin/env bash
# Runs the same sluice-bench commands against Sluice, nostr-rs-relay and strfry,
# one relay at a time on the same machine, each on a fresh store. Writes every
# report (JSON and the printed summary) under $OUT. See docs/benchmarks.md.
#
#   NRR=/path/to/nostr-rs-relay STRFRY=/path/to/strfry OUT=/tmp/sbs crates/bench/scripts/side-by-side.sh
#
#   STEPS="basic scale audience" NRR=... STRFRY=... RNOSTR=/path/to/rnostr OUT=/tmp/sbs \
#     crates/bench/scripts/side-by-side.sh
#
# Needs `cargo build --release -p sluice -p sluice-bench` first. A relay whose
# binary variable (NRR, STRFRY, RNOSTR) is unset is skipped. Optional: EVENTS
# (default 100000), PHASE_SECS (overload, default 10), ONLY (sluice|nrr|strfry|rnostr),
# STEPS (default "basic overload"; the steps are basic = publish/query/fanout/
# connections, overload, readflood, scale = each relay's own importer on the
# BIG file (default: `gen --count 1000000 --seed 7 --authors 10000`, made once
# in $OUT), timed, the store's size, then the query mix on that store, and
# audience = scripts/audience.sh at NS idle subscribed connections),
# READFLOOD_SECS ("before flood after", default "10 30 10"), NRR_BULKLOADER
# (default: nostr-rs-relay-bulkloader beside $NRR), SLUICE_IMPORT_FLAGS (more
# `sluice import` flags for `scale`), SLUICE_WRITE_MAP (store.write_map for
# Sluice's `scale` relay and import, default false: an import alone writes in
# the map anyway, with 65,536-event batches).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
B=${BENCH:-$ROOT/target/release/sluice-bench}
NRR=${NRR:-}
STRFRY=${STRFRY:-}
OUT=${OUT:-/tmp/side-by-side}
EVENTS=${EVENTS:-100000}
PHASE_SECS=${PHASE_SECS:-10}
STEPS=${STEPS:-basic overload}
read -r RF_BEFORE RF_FLOOD RF_AFTER <<<"${READFLOOD_SECS:-10 30 10}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: relay configs name their data directories
FILE=$OUT/events.jsonl
[ -s "$FILE" ] || "$B" gen --count "$EVENTS" --seed 1 --out "$FILE"
BIG=${BIG:-$OUT/big.jsonl}
if [[ " $STEPS " == *" scale "* ]] && [ ! -s "$BIG" ]; then
  "$B" gen --count 1000000 --seed 7 --authors 10000 --out "$BIG"
fi
SLUICE_IMPORT_FLAGS=${SLUICE_IMPORT_FLAGS:-}
SLUICE_WRITE_MAP=${SLUICE_WRITE_MAP:-false}
RNOSTR=${RNOSTR:-}

PID=
# A relay may exit non-zero on SIGTERM (strfry does): that does not end the script.
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT

wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "relay on port $1 did not start" >&2; exit 1
}

# Each relay NAME has start_NAME (for basic and overload), start_NAME_default
# (for readflood: the relay's default limits) and import_NAME (fills a fresh
# store with $FILE through the relay's own importer, the relay stopped; returns
# non-zero to skip readflood). Arguments: $1 port, $2 store directory.

start_sluice() {
  # Per-client limits raised: the bench plays many clients from few loopback
  # addresses, which the per-IP and per-author buckets would otherwise cut
  # to 20 and 10 events/s, and their read budgets. The global controllers stay
  # on (enforce). Direct messages (kind 4) are served to anyone, as the other
  # relays do, so every relay answers the same queries.
  SLUICE_SERVER__LISTEN=127.0.0.1:$1 SLUICE_STORE__PATH=$2 \
  SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP=100000 \
  SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S=100000000 \
  SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S=100000000 \
  SLUICE_AUTH__PRIVATE_KINDS='[]' SLUICE_STORE__WRITE_MAP=${WRITE_MAP:-false} \
  SLUICE_THROTTLE__TARGET_MEMORY_MB=512 SLUICE_LOG__LEVEL=warn \
    "$SLUICE" serve >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

start_sluice_default() {
  # The default config: only the address, the store and the log level are set.
  SLUICE_SERVER__LISTEN=127.0.0.1:$1 SLUICE_STORE__PATH=$2 SLUICE_LOG__LEVEL=warn \
    "$SLUICE" serve >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

import_sluice() {
  # shellcheck disable=SC2086 # the flags are a list
  SLUICE_STORE__PATH=$2 SLUICE_LOG__LEVEL=warn SLUICE_STORE__WRITE_MAP=${WRITE_MAP:-false} \
    "$SLUICE" import ${IMPORT_FLAGS:-} "${IMPORT_FILE:-$FILE}" 2>&1 |
    tail -20 | tee "$OUT/sluice-import${TAG:-}.txt"
}

start_nrr() {
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

start_nrr_default() { start_nrr "$@"; }

import_nrr() {
  # The relay creates its database once; the bulkloader (JSONL on standard
  # input) reads config.toml from its working directory.
  local bulk=${NRR_BULKLOADER:-$(dirname "$NRR")/nostr-rs-relay-bulkloader}
  if [ ! -x "$bulk" ]; then
    echo "no bulkloader at $bulk (set NRR_BULKLOADER): skipping nrr readflood"
    return 1
  fi
  start_nrr "$1" "$2"
  stop
  cp "$2.toml" "$2/config.toml"
  (cd "$2" && RUST_LOG=warn "$bulk" <"${IMPORT_FILE:-$FILE}") 2>&1 | tail -5 |
    tee "$OUT/nrr-import${TAG:-}.txt"
}

strfry_conf() {
  # Every key not set here keeps strfry's default (maxFilterLimit 500 among them).
  mkdir -p "$2"
  cat >"$2.conf" <<T
db = "$2/"
events {
    rejectEventsNewerThanSeconds = 31536000
    rejectEventsOlderThanSeconds = 3153600000
}
relay {
    bind = "127.0.0.1"
    port = $1
    nofiles = 0
    compression {
        enabled = false
    }
}
T
}

start_strfry() {
  strfry_conf "$1" "$2"
  # The default verbosity logs every event.
  "$STRFRY" --config="$2.conf" --verbosity=WARNING relay >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

start_strfry_default() { start_strfry "$@"; }

import_strfry() {
  strfry_conf "$1" "$2"
  "$STRFRY" --config="$2.conf" import <"${IMPORT_FILE:-$FILE}" 2>&1 | tail -5 |
    tee "$OUT/strfry-import${TAG:-}.txt"
}

rnostr_conf() {
  # Every key not set here keeps rnostr's default (max 20 subscriptions per
  # connection); the limit per filter raised to Sluice's 5,000, the created_at
  # window opened, its optional extensions off.
  mkdir -p "$2"
  cat >"$2.toml" <<T
[information]
name = "rnostr"
[data]
path = "$2"
[network]
host = "127.0.0.1"
port = $1
[limitation]
max_limit = 5000
max_event_time_older_than_now = 94608000
max_event_time_newer_than_now = 31536000
[auth]
enabled = false
[rate_limiter]
enabled = false
[metrics]
enabled = false
[count]
enabled = false
[search]
enabled = false
T
}

start_rnostr() {
  rnostr_conf "$1" "$2"
  RUST_LOG=warn "$RNOSTR" relay -c "$2.toml" >"$2.log" 2>&1 &
  PID=$!
  wait_port "$1"
}

start_rnostr_default() { start_rnostr "$@"; }

import_rnostr() {
  # `rnostr import` parses the events but does not check their signatures.
  rnostr_conf "$1" "$2"
  "$RNOSTR" import "$2/events" "${IMPORT_FILE:-$FILE}" 2>&1 | tail -5 |
    tee "$OUT/rnostr-import${TAG:-}.txt"
}

run() { # $1 relay name, $2 command name, rest: sluice-bench args
  local name=$1 cmd=$2; shift 2
  echo "== $name $cmd"
  "$B" "$cmd" "$@" --json "$OUT/$name-$cmd.json" | tee "$OUT/$name-$cmd.txt"
}

suite() { # $1 name, $2 port, $3 extra flags for overload and readflood
  local name=$1 port=$2 url=ws://127.0.0.1:$2
  local dir=$OUT/$name-store
  if [[ " $STEPS " == *" basic "* ]]; then
    rm -rf "$dir" "$dir.log"
    "start_$name" "$port" "$dir"
    run "$name" publish "$url" --events "$FILE" --connections 8 --window 16
    run "$name" query "$url" --events "$FILE" --connections 4 --duration-secs 20
    run "$name" fanout "$url" --subscribers 200 --publishers 2 --rate 200 --duration-secs 20
    run "$name" connections "$url" --count 1000 --subscribe --source-ips 16 --pid "$PID"
    stop
  fi
  if [[ " $STEPS " == *" overload "* ]]; then
    # A fresh store; capacity measured by the tool first (closed loop).
    rm -rf "$dir"
    "start_$name" "$port" "$dir"
    run "$name" overload "$url" --phases 0.5,1,2,5,1 --phase-secs "$PHASE_SECS" --pid "$PID" $3
    stop
  fi
  if [[ " $STEPS " == *" readflood "* ]]; then
    # A fresh store filled with the event file, then the relay at its default limits.
    rm -rf "$dir" "$dir.log"
    echo "== $name import"
    if "import_$name" "$port" "$dir"; then
      "start_${name}_default" "$port" "$dir"
      run "$name" readflood "$url" --before-secs "$RF_BEFORE" --flood-secs "$RF_FLOOD" \
        --after-secs "$RF_AFTER" --pid "$PID" $3
      stop
    fi
  fi
  if [[ " $STEPS " == *" scale "* ]]; then
    # The BIG file through the relay's own importer into a fresh store (the
    # relay stopped), timed; the store's size on disk; then the relay on that
    # store and the query mix derived from the same file.
    rm -rf "$dir" "$dir.log" "$dir.conf" "$dir.toml"
    echo "== $name import of $(basename "$BIG")"
    local t0 t1
    t0=$(date +%s.%N)
    if IMPORT_FILE=$BIG TAG=-big IMPORT_FLAGS=$SLUICE_IMPORT_FLAGS WRITE_MAP=$SLUICE_WRITE_MAP \
      "import_$name" "$port" "$dir"; then
      t1=$(date +%s.%N)
      local bytes
      bytes=$(du -sB1 "$dir" | cut -f1) # blocks in use: a write_map store is sparse
      printf '{"relay":"%s","file":"%s","import_secs":%.2f,"store_bytes":%s}\n' \
        "$name" "$(basename "$BIG")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$bytes" | tee "$OUT/$name-scale.json"
      WRITE_MAP=$SLUICE_WRITE_MAP "start_$name" "$port" "$dir"
      B_ARGS="--events $BIG --connections 4 --duration-secs 20"
      # shellcheck disable=SC2086
      run "$name" query "$url" $B_ARGS
      mv "$OUT/$name-query.json" "$OUT/$name-query-big.json"
      mv "$OUT/$name-query.txt" "$OUT/$name-query-big.txt"
      stop
    fi
  fi
  if [[ " $STEPS " == *" audience "* ]]; then
    # strfry and Sluice are started by audience.sh itself; nrr and rnostr too.
    ONLY=$name OUT=$OUT/audience SLUICE=$SLUICE BENCH=$B STRFRY=$STRFRY NRR=$NRR RNOSTR=$RNOSTR \
      "$ROOT/crates/bench/scripts/audience.sh"
  fi
}

wanted() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
skip() { echo "== skipping $1: set $2 to its binary"; }

if wanted sluice; then suite sluice 7811 ""; fi
if wanted nrr; then
  if [ -n "$NRR" ]; then suite nrr 7812 "--no-metrics"; else skip nrr NRR; fi
fi
if wanted strfry; then
  if [ -n "$STRFRY" ]; then suite strfry 7813 "--no-metrics"; else skip strfry STRFRY; fi
fi
if wanted rnostr; then
  if [ -n "$RNOSTR" ]; then suite rnostr 7814 "--no-metrics"; else skip rnostr RNOSTR; fi
fi
echo "reports in $OUT"
