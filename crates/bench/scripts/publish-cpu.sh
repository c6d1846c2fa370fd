#!/usr/bin/env bash
# Relay CPU per published event and throughput under `nostr-bench event -c 50`
# (50 connections, each publishing an event and waiting for its OK, again and
# again), for one or more Sluice builds and strfry, alternating, ROUNDS rounds;
# a fresh store and relay process each run. Prints one line per run and the
# medians. See docs/benchmarks.md#cost-per-event.
#
#   SLUICES="new=target/release/sluice old=/path/to/old/sluice" \
#   STRFRY=/path/to/strfry STRFRY_CONF=/path/to/strfry.conf \
#   crates/bench/scripts/publish-cpu.sh
#
# Needs nostr-bench 0.4 (`cargo install nostr-bench`; NOSTR_BENCH=path).
# Optional: ROUNDS (default 3), SECS (default 12), CONNS (default 50), OUT
# (directory for the raw outputs, default a temporary one), EXTRA_ENV (more
# VAR=value settings for every Sluice run). Sluice runs with throttle.mode =
# "off" (the default config allows one address 20 EVENTs/s); strfry with the
# given config (its db, port and nofiles set here).
set -euo pipefail
SLUICES=${SLUICES:-new=target/release/sluice}
STRFRY=${STRFRY:-}
STRFRY_CONF=${STRFRY_CONF:-}
NB=${NOSTR_BENCH:-nostr-bench}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-12}
CONNS=${CONNS:-50}
EXTRA_ENV=${EXTRA_ENV:-}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PORT=7811
HZ=$(getconf CLK_TCK)

PID=
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT

wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.1; done
  echo "relay did not start on $PORT" >&2; exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run NAME: the relay is PID; publishes for SECS and prints "NAME us_per_event events_per_s".
measure() {
  local name=$1 log=$OUT/$1-$2.jsonl
  wait_port
  sleep 0.5
  local before; before=$(cpu_ticks "$PID")
  timeout -s INT "$SECS" "$NB" event -c "$CONNS" --json "ws://127.0.0.1:$PORT" >"$log" 2>/dev/null || true
  local after; after=$(cpu_ticks "$PID")
  stop
  tail -n 1 "$log" | python3 -c '
import json, sys
name, ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.loads(sys.stdin.read())
n = r["message_stats"]["complete"]
secs = r["elapsed"] / 1000
print(f"{name} {ticks / hz * 1e6 / max(n, 1):.1f} {n / secs:.0f}")
' "$name" "$((after - before))" "$HZ"
}

for round in $(seq "$ROUNDS"); do
  for spec in $SLUICES; do
    name=${spec%%=*}; bin=${spec#*=}
    dir=$OUT/store-$name; rm -rf "$dir"
    # shellcheck disable=SC2086
    env SLUICE_STORE__PATH="$dir" SLUICE_SERVER__LISTEN="127.0.0.1:$PORT" SLUICE_LOG__LEVEL=warn \
      SLUICE_THROTTLE__MODE=off $EXTRA_ENV "$bin" serve >"$OUT/$name.log" 2>&1 &
    PID=$!
    measure "$name" "$round" | tee -a "$OUT/results.txt"
  done
  if [ -n "$STRFRY" ]; then
    db=$OUT/strfry-db; rm -rf "$db"; mkdir -p "$db"
    "$STRFRY" --config="${STRFRY_CONF:-/dev/null}" --set db="$db/" --set relay.bind=127.0.0.1 \
      --set relay.port="$PORT" --set relay.nofiles=0 --verbosity=WARNING relay 2>"$OUT/strfry.log" &
    PID=$!
    measure strfry "$round" | tee -a "$OUT/results.txt"
  fi
done

echo "medians over $ROUNDS rounds (relay CPU µs per published event, events/s):"
python3 - "$OUT/results.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, us, rate = line.split()
    rows.setdefault(name, []).append((float(us), float(rate)))
for name, rs in rows.items():
    print(f"  {name}: {statistics.median(u for u, _ in rs):.1f} µs/event, "
          f"{statistics.median(r for _, r in rs):.0f} events/s ({len(rs)} runs)")
PY
