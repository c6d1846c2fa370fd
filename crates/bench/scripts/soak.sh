#!/usr/bin/env bash
# The retention soak, RUNS times, each on a fresh store and relay process:
# `store.map_size_mb = 512`, `retention.max_store_mb = 200`, three exempt
# authors, BYTES of events offered at full speed beside polite clients (see
# docs/operating.md#running-for-years). Prints each run's polite OK p50/p99
# and the medians; reports and plots go under $OUT.
#
#   SLUICE=target/release/sluice BENCH=target/release/sluice-bench \
#   OUT=/tmp/soak crates/bench/scripts/soak.sh
#
# Optional: RUNS (default 3), BYTES (default 1G), PORT (default 7790),
# EXTRA_ENV (more VAR=value settings for the relay).
set -euo pipefail
SLUICE=${SLUICE:-target/release/sluice}
B=${BENCH:-target/release/sluice-bench}
OUT=${OUT:-/tmp/soak}
RUNS=${RUNS:-3}
BYTES=${BYTES:-1G}
PORT=${PORT:-7790}
EXTRA_ENV=${EXTRA_ENV:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

PID=
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT

cat >"$OUT/soak.toml" <<T
[store]
map_size_mb = 512
[retention]
max_store_mb = 200
$("$B" soak --print-exempt --exempt-authors 3 --seed 1 | grep '^exempt_pubkeys')
T

for run in $(seq "$RUNS"); do
  rm -rf "$OUT/store"
  # The bench plays many clients from few loopback addresses: per-client limits raised.
  # shellcheck disable=SC2086
  env SLUICE_SERVER__LISTEN="127.0.0.1:$PORT" SLUICE_STORE__PATH="$OUT/store" SLUICE_LOG__LEVEL=warn \
    SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S=100000 \
    SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S=100000 \
    SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S=100000 \
    SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP=100000 \
    SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S=100000000 \
    SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S=100000000 \
    $EXTRA_ENV "$SLUICE" serve --config "$OUT/soak.toml" >"$OUT/relay-$run.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  "$B" soak --url "ws://127.0.0.1:$PORT" --bytes "$BYTES" --target-mb 200 --exempt-authors 3 \
    --seed 1 --out "$OUT/soak-$run.json" >"$OUT/soak-$run.txt" 2>&1 || echo "run $run: the soak's end check failed" >&2
  # The writer's histograms over the whole run (commit, queue wait, retention steps).
  curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-$run.txt" || true
  stop
  "$B" plot "$OUT/soak-$run.json" -o "$OUT/soak-$run.svg" >/dev/null 2>&1 || true
  grep -iE "polite" "$OUT/soak-$run.txt" | sed "s/^/run $run: /"
done
