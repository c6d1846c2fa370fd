#!/usr/bin/env bash
# The CPU NIP-50 indexing adds per published event: `sluice-bench audience`
# (one publisher at RATE kind-1 EVENTs/s for SECS, one watcher, no idle
# connections) against a fresh relay with `search.enabled` true, then false,
# PAIRS times alternating; prints each run's relay CPU per event and the
# median of the pairs' differences. See docs/benchmarks.md#cost-per-event.
#
#   SLUICE=target/release/sluice BENCH=target/release/sluice-bench \
#   crates/bench/scripts/search-cost.sh
#
# Optional: PAIRS (default 5), RATE (default 200), SECS (default 20), PORT
# (default 7813), OUT (reports; default a temporary directory), EXTRA_ENV
# (more VAR=value settings for both relays, e.g.
# SLUICE_SEARCH__COMMIT_INTERVAL_MS=1000).
set -euo pipefail
SLUICE=${SLUICE:-target/release/sluice}
B=${BENCH:-target/release/sluice-bench}
PAIRS=${PAIRS:-5}
RATE=${RATE:-200}
SECS=${SECS:-20}
PORT=${PORT:-7813}
EXTRA_ENV=${EXTRA_ENV:-}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

PID=
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT

run() { # search-enabled pair
  local dir=$OUT/store-$1-$2
  rm -rf "$dir"
  # shellcheck disable=SC2086
  env SLUICE_STORE__PATH="$dir" SLUICE_SERVER__LISTEN="127.0.0.1:$PORT" SLUICE_LOG__LEVEL=warn \
    SLUICE_THROTTLE__MODE=off SLUICE_SEARCH__ENABLED="$1" $EXTRA_ENV "$SLUICE" serve >"$dir.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  "$B" audience "ws://127.0.0.1:$PORT" --idle 0 --rate "$RATE" --duration-secs "$SECS" \
    --relay-pid "$PID" --json "$OUT/audience-$1-$2.json" >"$OUT/audience-$1-$2.txt" 2>&1
  stop
  grep -oE '= [0-9.]+ ms/event' "$OUT/audience-$1-$2.txt" | head -1 | grep -oE '[0-9.]+'
}

diffs=()
for p in $(seq "$PAIRS"); do
  on=$(run true "$p")
  off=$(run false "$p")
  d=$(python3 -c "print(f'{$on - $off:.3f}')")
  echo "pair $p: search on $on ms/event, off $off ms/event, difference $d ms/event"
  diffs+=("$d")
done
python3 -c "import statistics, sys; print(f'median difference over $PAIRS pairs: {statistics.median(map(float, sys.argv[1:])):.3f} ms/event')" "${diffs[@]}"
