#!/usr/bin/env bash
# Fan-out against the audience: `sluice-bench audience` at N idle subscribed
# connections against Sluice and strfry, one relay after the other, a fresh
# store and a fresh relay process for every run; then prints a table (medians
# over REPEAT runs). Every report (JSON and the printed summary) goes under
# $OUT. See docs/benchmarks.md.
#
#   STRFRY=/path/to/strfry OUT=/tmp/audience crates/bench/scripts/audience.sh
#
# Needs `cargo build --release -p sluice -p sluice-bench` first (or set SLUICE
# and BENCH to the binaries). strfry is skipped when STRFRY is unset. Optional:
# NS (idle connections, default "0 1000 5000 10000"), REPEAT (default 1),
# RATE (events/s, default 200), SECS (publish seconds, default 20), REQS (REQs
# per idle connection, default 10), SLUICE_MODE (Sluice's throttle.mode,
# default off), STRFRY_CONF (a strfry.conf to start from; db, port, bind and
# nofiles are set on the command line; default: a minimal one written here),
# NRR, RNOSTR (nostr-rs-relay and rnostr binaries: those relays run too when
# set), ONLY (sluice|strfry|nrr|rnostr), EXTRA (more `audience` flags), TABLE_ONLY=1 (no runs:
# only the table of the reports already in $OUT). The table reads every
# NAME-nN-rR.json report in $OUT, including those of earlier runs.
#
# Each relay starts with its open-file limit raised to the hard limit
# (`ulimit -Hn`); the bench raises its own. Sluice is allowed the connections
# and subscriptions (server.max_connections, throttle.clients.
# max_connections_per_ip, limits.max_subscriptions: its default 20 unless REQS
# is more); strfry gets relay.nofiles = 0 (it keeps the limit it was started
# with) and keeps its maxSubsPerConnection (200).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
B=${BENCH:-$ROOT/target/release/sluice-bench}
STRFRY=${STRFRY:-}
STRFRY_CONF=${STRFRY_CONF:-}
OUT=${OUT:-/tmp/audience}
NS=${NS:-0 1000 5000 10000}
REPEAT=${REPEAT:-1}
RATE=${RATE:-200}
SECS=${SECS:-20}
REQS=${REQS:-10}
SLUICE_MODE=${SLUICE_MODE:-off}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: relay configs name their data directories
NOFILE=$(ulimit -Hn)

PID=
# A relay may exit non-zero on SIGTERM (strfry does): that does not end the script.
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true; fi; PID=; }
trap stop EXIT

wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "relay on port $1 did not start" >&2; exit 1
}

# start_NAME PORT DIR: starts the relay on a fresh store, sets PID (the relay
# process itself: the subshell execs it).

launch() { # $1 port, $2 store directory (its log is $2.log), rest: the command
  local port=$1 dir=$2
  shift 2
  (
    ulimit -n "$NOFILE"
    exec "$@"
  ) >"$dir.log" 2>&1 &
  PID=$!
  wait_port "$port"
}

start_sluice() {
  launch "$1" "$2" env SLUICE_SERVER__LISTEN="127.0.0.1:$1" SLUICE_STORE__PATH="$2" \
    SLUICE_LOG__LEVEL=warn SLUICE_THROTTLE__MODE="$SLUICE_MODE" \
    SLUICE_SERVER__MAX_CONNECTIONS="$NOFILE" \
    SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP="$NOFILE" \
    SLUICE_LIMITS__MAX_SUBSCRIPTIONS=$((REQS > 20 ? REQS : 20)) \
    "$SLUICE" serve
}

start_strfry() {
  mkdir -p "$2"
  local conf=$STRFRY_CONF
  if [ -z "$conf" ]; then
    # Every key not set here keeps strfry's default (maxSubsPerConnection 200).
    # No compression and no sliding window: else uWS allocates a zlib window
    # per connection.
    conf=$2.conf
    cat >"$conf" <<T
db = "$2/"
relay {
    compression {
        enabled = false
        slidingWindow = false
    }
}
T
  fi
  launch "$1" "$2" "$STRFRY" --config="$conf" --set db="$2/" --set relay.bind=127.0.0.1 \
    --set relay.port="$1" --set relay.nofiles=0 --verbosity=WARNING relay
}

start_nrr() {
  # nostr-rs-relay: its default config (at most 32 subscriptions per
  # connection) but the address and the data directory.
  mkdir -p "$2"
  cat >"$2.toml" <<T
[database]
data_directory = "$2"
[network]
address = "127.0.0.1"
port = $1
T
  launch "$1" "$2" env RUST_LOG=warn "$NRR" --config "$2.toml"
}

start_rnostr() {
  # rnostr: its defaults (at most 20 subscriptions per connection) but the
  # address, the data directory and the created_at window.
  mkdir -p "$2"
  cat >"$2.toml" <<T
[data]
path = "$2"
[network]
host = "127.0.0.1"
port = $1
[limitation]
max_event_time_older_than_now = 94608000
max_event_time_newer_than_now = 31536000
[rate_limiter]
enabled = false
[metrics]
enabled = false
T
  launch "$1" "$2" env RUST_LOG=warn "$RNOSTR" relay -c "$2.toml"
}

one() { # $1 relay name, $2 port, $3 N, $4 repeat
  local name=$1 port=$2 n=$3 r=$4
  local dir=$OUT/$name-store base=$OUT/$name-n$n-r$r
  rm -rf "$dir" "$dir.log"
  "start_$name" "$port" "$dir"
  echo "== $name N=$n run $r (pid $PID)"
  # shellcheck disable=SC2086 # EXTRA is a list of flags
  "$B" audience "ws://127.0.0.1:$port" --idle "$n" --reqs-per-idle "$REQS" --rate "$RATE" \
    --duration-secs "$SECS" --relay-pid "$PID" --json "$base.json" $EXTRA | tee "$base.txt"
  stop
}

wanted() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
RELAYS=()
if wanted sluice; then RELAYS+=("sluice 7821"); fi
if wanted strfry; then
  if [ -n "$STRFRY" ]; then
    RELAYS+=("strfry 7823")
  elif [ -z "${TABLE_ONLY:-}" ]; then
    echo "== skipping strfry: set STRFRY to its binary"
  fi
fi

if wanted nrr && [ -n "${NRR:-}" ]; then RELAYS+=("nrr 7822"); fi
if wanted rnostr && [ -n "${RNOSTR:-}" ]; then RELAYS+=("rnostr 7824"); fi

[ -n "${TABLE_ONLY:-}" ] && REPEAT=0
for r in $(seq "$REPEAT"); do
  for relay in "${RELAYS[@]}"; do
    read -r name port <<<"$relay"
    for n in $NS; do one "$name" "$port" "$n" "$r"; done
  done
done

# The table: one row per relay and N, the median of each figure over the runs.
table() {
  jq -rn '
    def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
    def f(d): if . == null then "n/a" else (. * pow(10; d) | round) / pow(10; d) | tostring end;
    [inputs | {
      relay: (input_filename | split("/") | last | split("-n") | first),
      n: .idle_connections,
      cpu: .relay_cpu_ms_per_event,
      p50: .watcher.delivery_latency.p50_ms,
      p99: .watcher.delivery_latency.p99_ms,
      accepted: .watcher.publish.accepted,
      offered: .watcher.publish.offered,
      eose: .idle.eose,
      closed: .idle.closed,
      prefixes: (.idle.closed_prefixes | keys),
      unanswered: .idle.unanswered,
      dropped: .idle.dropped,
      rss: ((.relay_rss_bytes_end // 0) / 1048576)
    }]
    | group_by(.relay) | map(
        (map(select(.n == 0)) | map(.cpu) | median) as $base
        | group_by(.n)[] | {
            relay: .[0].relay, n: .[0].n, runs: length,
            cpu: (map(.cpu) | median), cpu_min: (map(.cpu) | min), cpu_max: (map(.cpu) | max),
            p50: (map(.p50) | median), p99: (map(.p99) | median),
            accepted: (map(.accepted) | median), offered: (map(.offered) | median),
            eose: (map(.eose) | median), closed: (map(.closed) | median),
            prefixes: (map(.prefixes) | add | unique | join(", ")),
            unanswered: (map(.unanswered) | median), dropped: (map(.dropped) | median),
            rss: (map(.rss) | median), base: $base
          })
    | flatten
    | ("| relay | N idle | CPU ms/event (min-max) | x N=0 | delivery p50 ms | p99 ms | accepted/offered | idle REQs EOSE / CLOSED / unanswered | idle dropped | RSS MiB | runs |",
       "|---|---|---|---|---|---|---|---|---|---|---|"),
      (.[] | "| \(.relay) | \(.n) | \(.cpu | f(3)) (\(.cpu_min | f(2))-\(.cpu_max | f(2))) | \(if .base and .base > 0 and .cpu then (.cpu / .base | f(2)) else "n/a" end) | \(.p50 | f(1)) | \(.p99 | f(1)) | \(.accepted)/\(.offered) | \(.eose) / \(.closed)\(if .prefixes != "" then " `\(.prefixes)`" else "" end) / \(.unanswered) | \(.dropped) | \(.rss | f(1)) | \(.runs) |")
  ' "$@"
}
shopt -s nullglob
FILES=("$OUT"/*-n*-r*.json)
table "${FILES[@]}" | tee "$OUT/table.md"
echo "reports in $OUT"
