#!/usr/bin/env bash
# Two builds of Sluice in one sitting, alternating, ROUNDS each
# (docs/benchmarks.md#before-and-after-a-change): publish and the query mix
# on the 100k file (throttle off), then the write flood beside polite
# clients at the default per-client limits (`overload --phases 1,2`).
#
#   crates/bench/scripts/before-after.sh BEFORE_BIN_DIR AFTER_BIN_DIR [ROUNDS] [OUT]
#
# Each BIN_DIR holds `sluice` and `sluice-bench` (`cargo build --release -p
# sluice -p sluice-bench` of each commit). Writes one JSON per run in OUT
# and prints the medians.
set -u
B0=$1; B1=$2; N=${3:-3}; OUT=${4:-before-after}
mkdir -p "$OUT"
BENCH=$B1/sluice-bench
EV=$OUT/events-100k.jsonl
[ -s "$EV" ] || "$BENCH" gen --count 100000 --seed 1 --out "$EV"
port=7810
up() { for _ in $(seq 50); do curl -s "http://127.0.0.1:$1/healthz" >/dev/null && return; sleep 0.2; done; }
run_one() { # label bindir
  local label=$1 bin=$2 store pid U
  port=$((port+1)); U=ws://127.0.0.1:$port; store=$(mktemp -d)
  SLUICE_SERVER__LISTEN=127.0.0.1:$port SLUICE_STORE__PATH=$store/store SLUICE_THROTTLE__MODE=off \
    SLUICE_SERVER__MAX_HTTP_CONNECTIONS_PER_IP=1000 SLUICE_LOG__LEVEL=warn "$bin/sluice" serve >/dev/null 2>&1 &
  pid=$!; up $port
  "$BENCH" publish $U --events "$EV" --limit 30000 --connections 8 --window 16 --json "$OUT/pub-$label-$port.json" >/dev/null 2>&1
  "$BENCH" query $U --events "$EV" --connections 4 --duration-secs 10 --json "$OUT/q-$label-$port.json" >/dev/null 2>&1
  kill $pid; wait $pid 2>/dev/null; rm -rf "$store"
  port=$((port+1)); U=ws://127.0.0.1:$port; store=$(mktemp -d)
  SLUICE_SERVER__LISTEN=127.0.0.1:$port SLUICE_STORE__PATH=$store/store SLUICE_LOG__LEVEL=warn "$bin/sluice" serve >/dev/null 2>&1 &
  pid=$!; up $port
  "$BENCH" overload $U --phases 1,2 --phase-secs 8 --pid $pid --json "$OUT/ov-$label-$port.json" >/dev/null 2>&1
  kill $pid; wait $pid 2>/dev/null; rm -rf "$store"
}
for _ in $(seq "$N"); do run_one before "$B0"; run_one after "$B1"; done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
def runs(kind, label, get):
    return [get(json.load(open(f))) for f in sorted(glob.glob(f"{out}/{kind}-{label}-*.json"))]
rows = [
    ("publish, stored/s", "pub", lambda d: d["results"]["stored_per_sec"]),
    ("query mix, q/s", "q", lambda d: d["total"]["queries_per_sec"]),
    ("query EOSE p99, ms", "q", lambda d: d["total"]["time_to_eose"]["p99_ms"]),
    ("polite OK p99 at 1x, ms", "ov", lambda d: d["phases"][0]["polite"]["accepted_latency"]["p99_ms"]),
    ("polite OK p99 at 2x, ms", "ov", lambda d: d["phases"][1]["polite"]["accepted_latency"]["p99_ms"]),
    ("abusers at 2x: accepted", "ov", lambda d: d["phases"][1]["abusive"]["accepted"]),
    ("abusers at 2x: refused", "ov", lambda d: d["phases"][1]["abusive"]["refused"]),
]
for name, kind, get in rows:
    b, a = runs(kind, "before", get), runs(kind, "after", get)
    print(f"{name:26} before {statistics.median(b):9.2f}  after {statistics.median(a):9.2f}  "
          f"(runs {[round(x, 2) for x in b]} / {[round(x, 2) for x in a]})")
PY
