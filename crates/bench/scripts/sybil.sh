#!/bin/bash
# The Sybil measurement of docs/throttling.md ("Measured: a Sybil flood"): one release relay per
# run, on a fresh store, with the trust config of the run; sluice-bench sybil against it.
#   crates/bench/scripts/sybil.sh OUT_DIR          (after cargo build --release -p sluice -p sluice-bench)
set -eu
OUT=${1:-/tmp/sybil}; mkdir -p "$OUT"
BIN=${SLUICE:-target/release/sluice}; B=${SLUICE_BENCH:-target/release/sluice-bench}
SEED=$($B sybil --print-seed | awk '/^seed pubkey/ {print $3}')
LIMITED="[trust]
seed_pubkeys = [\"$SEED\"]
outsider_writes = \"limited\"
outsider_events_per_s = 50.0"
ADAPTIVE="$LIMITED
[pow]
adaptive = true
max_difficulty = 16"
run() { # TAG CONFIG [bench args...]
  local tag=$1 cfg=$2; shift 2
  local d; d=$(mktemp -d); local port=$((20000 + RANDOM % 10000))
  printf '%s\n' "$cfg" > "$d/c.toml"
  ( exec env SLUICE_SERVER__LISTEN=127.0.0.1:$port SLUICE_STORE__PATH="$d/s" SLUICE_LOG__LEVEL=warn \
      "$BIN" serve --config "$d/c.toml" ) & local pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  "$B" sybil "ws://127.0.0.1:$port" --pid $pid --json "$OUT/$tag.json" "$@" | tee "$OUT/$tag.txt"
  echo "relay CPU $(awk '{print ($14+$15)/100}' /proc/$pid/stat) s" | tee -a "$OUT/$tag.txt"
  kill -TERM $pid; wait $pid || true
  rm -rf "$d"
}
run unloaded "$LIMITED" --sources 0
run off ""
run limited "$LIMITED"
run adaptive "$ADAPTIVE"
run adaptive-mining-outsiders "$ADAPTIVE" --polite-untrusted --polite-mine-bits 16
for t in off limited adaptive; do "$B" plot "$OUT/$t.json" --out "$OUT/$t.svg"; done
