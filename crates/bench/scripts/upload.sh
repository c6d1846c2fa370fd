#!/usr/bin/env bash
# Paced uploads: `sluice sync --direction up` of COUNT generated events from store A into a peer B
# that limits its writers, then what B stored, the `rate-limited:` answers as a share of sends
# after the first 10 s, the rate the upload converged to against the peer's limit, and the rate
# over time (from the sync's progress lines). See docs/operating.md, "Uploads: pace, retries,
# refusals".
#
#   crates/bench/scripts/upload.sh                         # B: Sluice at its default config (20/s)
#   COUNT=2000 crates/bench/scripts/upload.sh
#   PEER_RATE=2000 crates/bench/scripts/upload.sh          # B: Sluice allowing 2,000 EVENTs/s
#   PEER=strfry crates/bench/scripts/upload.sh             # B: strfry with ratelimit-plugin.py
#   PEER=strfry PEER_RATE=2000 crates/bench/scripts/upload.sh
#   MODE=mirror crates/bench/scripts/upload.sh            # A serves, `[[mirror]] direction = "up"`
#
# Needs `cargo build --release -p sluice -p sluice-bench` first (SLUICE, BENCH override the
# binaries; STRFRY the strfry binary, default /root/peers/strfry/strfry). Optional: COUNT
# (default 20000), SEED (3), PEER (sluice|strfry), PEER_RATE (the peer's EVENTs/s per address;
# default: Sluice's default config, 20/s for strfry's plugin), SYNC_FLAGS (more `sluice sync`
# flags, e.g. --up-decrease 0.7), PORT (7971; A's relay in mirror mode on PORT+1), OUT
# (/tmp/upload: stores, logs, the report), MODE (sync|mirror). In mirror mode A runs
# `sluice serve` with a `[[mirror]]` up to B and the figures come from A's /metrics, read every
# second until B answered every event (accepted or duplicate).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
B=${BENCH:-$ROOT/target/release/sluice-bench}
STRFRY=${STRFRY:-/root/peers/strfry/strfry}
COUNT=${COUNT:-20000}
SEED=${SEED:-3}
PEER=${PEER:-sluice}
PEER_RATE=${PEER_RATE:-}
SYNC_FLAGS=${SYNC_FLAGS:-}
PORT=${PORT:-7971}
MODE=${MODE:-sync}
OUT=${OUT:-/tmp/upload}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$OUT/$MODE-$PEER-${PEER_RATE:-default}-$COUNT
rm -rf "$RUN" && mkdir -p "$RUN"
FILE=$OUT/events-$COUNT-$SEED.jsonl
[ -s "$FILE" ] || "$B" gen --count "$COUNT" --seed "$SEED" --out "$FILE"

PID=
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT
wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "peer on port $1 did not start" >&2; exit 1
}

# Store A: the events to upload.
SLUICE_STORE__PATH=$RUN/a SLUICE_LOG__LEVEL=warn "$SLUICE" import "$FILE" >"$RUN/import.log" 2>&1
LOCAL=$(SLUICE_STORE__PATH=$RUN/a SLUICE_LOG__LEVEL=warn "$SLUICE" export 2>/dev/null | wc -l)

case $PEER in
  sluice)
    LIMIT=${PEER_RATE:-20}
    env_rate=()
    if [ -n "$PEER_RATE" ]; then
      env_rate=(SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S="$PEER_RATE"
        SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S="$PEER_RATE")
    fi
    # The default config but for the address, the store, the log level (and the rates asked).
    env SLUICE_SERVER__LISTEN=127.0.0.1:$PORT SLUICE_STORE__PATH="$RUN/b" SLUICE_LOG__LEVEL=warn \
      "${env_rate[@]}" "$SLUICE" serve >"$RUN/b.log" 2>&1 &
    PID=$!
    ;;
  strfry)
    LIMIT=${PEER_RATE:-20}
    mkdir -p "$RUN/b"
    cat >"$RUN/b.conf" <<T
db = "$RUN/b/"
events {
    rejectEventsNewerThanSeconds = 31536000
    rejectEventsOlderThanSeconds = 3153600000
}
relay {
    bind = "127.0.0.1"
    port = $PORT
    nofiles = 0
    writePolicy {
        plugin = "python3 $SCRIPTS/ratelimit-plugin.py $LIMIT $LIMIT"
    }
}
T
    "$STRFRY" --config="$RUN/b.conf" --verbosity=WARNING relay >"$RUN/b.log" 2>&1 &
    PID=$!
    ;;
  *) echo "PEER must be sluice or strfry" >&2; exit 2 ;;
esac
wait_port "$PORT"

STATUS=0
if [ "$MODE" = mirror ]; then
  APID=
  stop_a() { if [ -n "$APID" ]; then kill -TERM "$APID" 2>/dev/null && wait "$APID" 2>/dev/null || true; fi; APID=; }
  trap 'stop_a; stop' EXIT
  APORT=$((PORT + 1))
  cat >"$RUN/a.toml" <<T
[[mirror]]
url = "ws://127.0.0.1:$PORT"
direction = "up"
T
  SLUICE_SERVER__LISTEN=127.0.0.1:$APORT SLUICE_STORE__PATH=$RUN/a SLUICE_LOG__LEVEL=warn \
    "$SLUICE" serve --config "$RUN/a.toml" >"$RUN/a.log" 2>&1 &
  APID=$!
  wait_port "$APORT"
  # One line a second: t, pace, accepted, duplicate, refused, retried (rate-limited), retried
  # (reconnect), in flight; until B answered every event of A.
  python3 - "http://127.0.0.1:$APORT/metrics" "$LOCAL" "$LIMIT" "$PEER" >"$RUN/report.txt" <<'PY' || STATUS=$?
import re, sys, time, urllib.request
url, local, limit, peer = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def scrape():
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    def v(name, *labels):
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(l in line for l in labels):
                total += float(line.rsplit(" ", 1)[1])
        return total
    return (v("sluice_mirror_up_rate_events_per_second"),
            v("sluice_mirror_events_out_total", 'result="accepted"'),
            v("sluice_mirror_events_out_total", 'result="duplicate"'),
            v("sluice_mirror_events_out_total", 'result="refused"'),
            v("sluice_mirror_up_retries_total", 'cause="rate_limited"'),
            v("sluice_mirror_up_retries_total", 'cause="reconnect"'),
            v("sluice_mirror_up_in_flight"))
t0 = time.monotonic()
series = []
deadline = t0 + max(600.0, 4.0 * local / limit)
while True:
    time.sleep(1.0)
    s = scrape()
    t = time.monotonic() - t0
    series.append((t,) + s)
    if s[1] + s[2] + s[3] >= local or time.monotonic() > deadline:
        break
t, pace, acc, dup, ref, rl, rc, infl = series[-1]
done = acc + dup + ref >= local
sends = lambda s: s[2] + s[3] + s[4] + s[5] + s[6]
at10 = next((s for s in series if s[0] >= 10.0), None)
if at10:
    late, late_rl = sends(series[-1]) - sends(at10), rl - at10[5]
    share = "%.2f%% (%d of %d sends)" % (100.0 * late_rl / max(late, 1), late_rl, late)
else:
    share = "n/a (done within 10 s)"
# Converged: accepted per second over the last 10 s before the backlog ran out, once past 10 s.
tail = [s for s in series if s[0] >= 10.0]
conv = (tail[-1][2] - tail[max(0, len(tail) - 11)][2]) / max(tail[-1][0] - tail[max(0, len(tail) - 11)][0], 1e-9) if len(tail) > 1 else float("nan")
print("mode: mirror up; peer: %s, limit %g EVENTs/s per address" % (peer, limit))
print("completed: %s; events in A %d, answered by B %d (accepted %d, duplicate %d, refused %d); %.0f s" % ("yes" if done and ref == 0 else "NO", local, acc + dup + ref, acc, dup, ref, t))
print("retried: %d after rate-limited answers, %d after a lost connection" % (rl, rc))
print("rate-limited answers after the first 10 s: %s (target <= 5%%)" % share)
print("converged rate (accepted, last 10 s with a backlog): %.1f/s = %.1f%% of the limit (target within 20%%)" % (conv, 100.0 * conv / limit))
print("rate over time (t s, pace/s, accepted/s over 10 s):")
row = []
for i, s in enumerate(series):
    if i % 10 == 9:
        j = max(0, i - 10)
        row.append("%.0f:%.1f/%.1f" % (s[0], s[1], (s[2] - series[j][2]) / max(s[0] - series[j][0], 1e-9)))
print("  " + " ".join(row))
sys.exit(0 if done and ref == 0 else 1)
PY
  stop_a
  stop
  case $PEER in
    sluice) STORED=$(SLUICE_STORE__PATH=$RUN/b SLUICE_LOG__LEVEL=warn "$SLUICE" export 2>/dev/null | wc -l) ;;
    strfry) STORED=$("$STRFRY" --config="$RUN/b.conf" export 2>/dev/null | wc -l) ;;
  esac
  echo "stored on B: $STORED of $LOCAL" | tee -a "$RUN/report.txt"
  cat "$RUN/report.txt"
  [ "$STATUS" -eq 0 ] && [ "$STORED" -ge "$LOCAL" ]
  exit
fi

# shellcheck disable=SC2086
SLUICE_STORE__PATH=$RUN/a SLUICE_LOG__LEVEL=warn \
  "$SLUICE" sync "ws://127.0.0.1:$PORT" --direction up $SYNC_FLAGS 2>"$RUN/sync.log" || STATUS=$?
stop
case $PEER in
  sluice) STORED=$(SLUICE_STORE__PATH=$RUN/b SLUICE_LOG__LEVEL=warn "$SLUICE" export 2>/dev/null | wc -l) ;;
  strfry) STORED=$("$STRFRY" --config="$RUN/b.conf" export 2>/dev/null | wc -l) ;;
esac

python3 - "$RUN/sync.log" "$STATUS" "$LOCAL" "$STORED" "$LIMIT" "$PEER" <<'PY' | tee "$RUN/report.txt"
import re, sys
log, status, local, stored, limit, peer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
text = open(log).read()
series = []
for m in re.finditer(r"sync: up ([\d.]+) s: pace ([\d.]+)/s, accepted ([\d.]+)/s over 10 s;.*? (\d+) sent, .*? (\d+) rate-limited,", text):
    series.append(tuple(float(x) for x in m.groups()))
summary = re.search(r"sync: uploaded (\d+) \((\d+) refused\); (\d+) already there; converged at ([\d.]+)/s.*?; (\d+) first sends, (\d+) retried after (\d+) rate-limited answers; refused by prefix: (.*); ([\d.]+) s", text)
if not summary:
    print(text[-3000:]); sys.exit(1)
acc, ref, dup, conv, first, retried, limited, prefixes, secs = summary.groups()
sent_end, limited_end = int(first) + int(retried), int(limited)
# Sends and rate-limited answers after the first 10 s: the totals less those at the first
# progress line at or past 10 s.
at10 = next((s for s in series if s[0] >= 10.0), None)
if at10:
    sent_late, limited_late = sent_end - int(at10[3]), limited_end - int(at10[4])
    share = "%.2f%% (%d of %d sends)" % (100.0 * limited_late / max(sent_late, 1), limited_late, sent_late)
else:
    share = "n/a (done within 10 s)"
print("peer: %s, limit %g EVENTs/s per address" % (peer, limit))
print("completed: %s (sync exit %d); events in A %d, stored on B %d" % ("yes" if status == 0 and stored >= local else "NO", status, local, stored))
print("uploaded %s, refused %s (%s), already there %s; %s first sends, %s retried after %s rate-limited answers; %s s" % (acc, ref, prefixes, dup, first, retried, limited, secs))
print("rate-limited answers after the first 10 s: %s (target <= 5%%)" % share)
print("converged rate (accepted, last 10 s with a backlog): %s/s = %.1f%% of the limit (target within 20%%)" % (conv, 100.0 * float(conv) / limit))
print("rate over time (t s, pace/s, accepted/s over 10 s):")
print("  " + " ".join("%g:%g/%g" % (t, p, a) for t, p, a, _, _ in series))
PY
