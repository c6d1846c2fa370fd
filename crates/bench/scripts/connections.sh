#!/bin/sh
# Memory per subscribed connection, Sluice then strfry, one after the other
# in one sitting (docs/benchmarks.md#memory-per-connection).
#
#   SLUICE=target/release/sluice BENCH=target/release/sluice-bench \
#   STRFRY=/path/to/strfry STRFRY_CONF=/path/to/strfry.conf \
#   crates/bench/scripts/connections.sh 10000
#
# Each relay gets a fresh store; Sluice runs with throttle.mode = "off" and
# its connection caps raised. STRFRY unset: Sluice only. DEFLATE=1: every
# connection offers permessage-deflate (and agrees it with both relays).
# Needs a descriptor limit above N for both processes (ulimit -n).
set -eu
N=${1:-10000}
SLUICE=${SLUICE:-target/release/sluice}
BENCH=${BENCH:-target/release/sluice-bench}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cat > "$DIR/sluice.toml" <<CONF
[server]
listen = "127.0.0.1:7801"
max_connections = 30000
[throttle]
mode = "off"
[throttle.clients]
max_connections_per_ip = 30000
[store]
path = "$DIR/sluice-store"
CONF
measure() { # URL PID
  sleep 3
  "$BENCH" connections "$1" --count "$N" --subscribe --source-ips 250 --pid "$2" --settle-secs 3 \
    ${DEFLATE:+--deflate} \
    | grep -E "opened|RSS|agreed"
  kill "$2"; wait "$2" 2>/dev/null || true
}
echo "sluice:"
"$SLUICE" serve --config "$DIR/sluice.toml" > "$DIR/sluice.log" 2>&1 &
measure ws://127.0.0.1:7801 $!
if [ -n "${STRFRY:-}" ]; then
  mkdir -p "$DIR/strfry-db"
  sed -e "s#^db = .*#db = \"$DIR/strfry-db/\"#" -e 's#port = [0-9]*#port = 7802#' \
    "$STRFRY_CONF" > "$DIR/strfry.conf"
  echo "strfry:"
  "$STRFRY" --config="$DIR/strfry.conf" relay > "$DIR/strfry.log" 2>&1 &
  measure ws://127.0.0.1:7802 $!
fi
