#!/bin/bash
# Budgets in a hierarchy (docs/throttling.md, "Budgets in a hierarchy"): anonymous writers capped
# at 100 EVENTs/s together, 300 anonymous addresses flooding (each under its own per-address rate,
# every event by a fresh key) beside authenticated (NIP-42) clients; one release relay per run on
# a fresh store: the authenticated clients alone, then beside the flood without budgets and with
# them. Prints the anonymous total rate (target: at most 110/s with the cap), the authenticated
# clients' success and OK p99, and the budgets' counters.
#   crates/bench/scripts/budgets.sh OUT_DIR      (after cargo build --release -p sluice -p sluice-bench)
# SOURCES, RATE (per source), SECS, AUTHED, AUTHED_RATE override the flood's shape.
set -eu
OUT=${1:-/tmp/budgets}; mkdir -p "$OUT"
BIN=${SLUICE:-target/release/sluice}; B=${SLUICE_BENCH:-target/release/sluice-bench}
SOURCES=${SOURCES:-300}; RATE=${RATE:-8}; SECS=${SECS:-20}; AUTHED=${AUTHED:-3}; AUTHED_RATE=${AUTHED_RATE:-2}
CAPPED='[[throttle.budgets]]
name = "anonymous"
class = "anonymous"
rate_per_s = 100
burst = 100

[[throttle.budgets]]
name = "authenticated"
class = "authenticated"
rate_per_s = 1000'
run() { # TAG CONFIG [SOURCES]
  local tag=$1 cfg=$2 sources=${3:-$SOURCES}
  local d; d=$(mktemp -d); local port=$((20000 + RANDOM % 10000))
  printf '%s\n' "$cfg" > "$d/c.toml"
  # SLUICE_BENCH would read as a [bench] section: not the relay's.
  ( exec env -u SLUICE_BENCH SLUICE_SERVER__LISTEN=127.0.0.1:$port SLUICE_STORE__PATH="$d/s" SLUICE_LOG__LEVEL=warn \
      "$BIN" serve --config "$d/c.toml" ) & local pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  kill -0 $pid 2>/dev/null || { echo "the relay did not start"; exit 1; }
  "$B" sybil "ws://127.0.0.1:$port" --pid $pid --json "$OUT/$tag.json" \
      --sources "$sources" --rate-per-source "$RATE" --secs "$SECS" \
      --polite "$AUTHED" --polite-rate "$AUTHED_RATE" --polite-auth --polite-untrusted | tee "$OUT/$tag.txt"
  sleep 0.3 # one monitor tick: the budgets' counters on /metrics
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^sluice_throttle_budget_(admitted|refused|borrowed)_total' \
      | tee -a "$OUT/$tag.txt" || true
  echo "relay CPU $(awk '{print ($14+$15)/100}' /proc/$pid/stat) s" | tee -a "$OUT/$tag.txt"
  kill -TERM $pid; wait $pid || true
  rm -rf "$d"
  python3 - "$OUT/$tag.json" "$tag" <<'EOF' | tee -a "$OUT/$tag.txt"
import json, sys
r = json.load(open(sys.argv[1]))
p = r["polite"]
print(f"{sys.argv[2]}: anonymous {r['spam_accepted_per_sec']:.1f}/s taken "
      f"({r['spam']['accepted']} of {r['spam']['offered']} offered in {r['secs']} s); "
      f"authenticated success {100 * p['success_ratio']:.1f}% ({p['accepted']} of {p['offered']}), "
      f"OK p50 {p['accepted_latency']['p50_ms']:.1f} ms, p99 {p['accepted_latency']['p99_ms']:.1f} ms")
EOF
}
# The authenticated clients alone first: the p99 they keep beside the flood.
run alone "$CAPPED" 0
run nobudgets ""
run capped "$CAPPED"
