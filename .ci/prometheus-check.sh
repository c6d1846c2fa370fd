#!/usr/bin/env bash
# Real-tool checks of the monitoring path, run by .ci/run after the tests:
#  1. promtool validates deploy/prometheus/prometheus.yml and alerts.yml and
#     runs the alert unit tests (deploy/prometheus/tests/*.yml);
#  2. the built relay (target/debug/sluice) starts on port 0 with a temporary
#     store; a raw WebSocket client stores one real event and opens one
#     subscription, so counters and histograms have samples;
#  3. `promtool check metrics` parses a real scrape of /metrics;
#  4. a real Prometheus, on the deploy config with only the target and the
#     intervals replaced, scrapes that relay; its HTTP API must show the
#     target up, the Sluice series, the alert rules healthy, and every query
#     of the Grafana dashboard accepted.
# Installs prometheus (with promtool), jq and curl from Debian packages if
# missing. Needs bash, coreutils, grep and sed besides. Takes about 15 s.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# RELAY_BIN: another build of the relay (not SLUICE_*: the relay reads those as config).
SLUICE=${RELAY_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/sluice}
DASHBOARD=$ROOT/deploy/grafana/dashboards/sluice.json
export LC_ALL=C

say() { echo "prometheus-check: $*"; }
fail() {
    echo "prometheus-check: FAILED: $*" >&2
    exit 1
}

# Polls `$@` every 0.1 s until it succeeds, at most $TRIES times (default
# 300, 30 s): readiness is waited for, never guessed with a fixed sleep.
retry() {
    local tries=${TRIES:-300}
    for ((i = 0; i < tries; i++)); do
        if "$@"; then return 0; fi
        sleep 0.1
    done
    return 1
}

# --- tools -------------------------------------------------------------------
missing=()
for tool in prometheus:prometheus promtool:prometheus jq:jq curl:curl; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | grep .)
if ((${#missing[@]})); then
    say "installing ${missing[*]} from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
say "$(promtool --version 2>&1 | head -n1)"

# --- 1. static checks ----------------------------------------------------------
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/alerts.yml
for t in deploy/prometheus/tests/*.yml; do
    promtool test rules "$t"
done

# --- 2. a real relay -------------------------------------------------------------
if [[ ! -x $SLUICE ]]; then
    say "building the relay"
    cargo build -p sluice
fi

WORK=$(mktemp -d)
WS=
SLUICE_PID=
PROM_PID=
cleanup() {
    local rc=$?
    [[ -n ${WS:-} ]] && exec {WS}>&-
    for pid in $PROM_PID $SLUICE_PID; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in $PROM_PID $SLUICE_PID; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        for log in "$WORK"/*.log; do
            [[ -f $log ]] && { echo "--- $log (last 40 lines)"; tail -n 40 "$log"; }
        done
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

# The shipped config file, as the container and the systemd unit use it, with
# the environment overriding the address and the store, as they do.
SLUICE_SERVER__LISTEN=127.0.0.1:0 \
    SLUICE_STORE__PATH="$WORK/store" \
    SLUICE_LOG__FORMAT=text \
    "$SLUICE" serve --config config/sluice.toml >"$WORK/sluice.log" 2>&1 &
SLUICE_PID=$!

relay_listening() {
    kill -0 "$SLUICE_PID" 2>/dev/null || fail "sluice exited during start-up"
    grep -q 'listening on ws://' "$WORK/sluice.log"
}
retry relay_listening || fail "sluice did not report its address"
ADDR=$(grep -m1 -o 'listening on ws://[0-9.]*:[0-9]*' "$WORK/sluice.log" | sed 's|.*ws://||')
PORT=${ADDR##*:}
say "sluice listening on $ADDR"

http_status() { curl -s -o /dev/null -w '%{http_code}' "http://$ADDR$1"; }
[[ $(http_status /healthz) == 200 ]] || fail "/healthz is not 200"
ready() { [[ $(http_status /readyz) == 200 ]]; }
retry ready || fail "/readyz never became 200"

# A WebSocket client in bash: client frames must be masked; an all-zero
# masking key leaves the payload as it is, which any server accepts.
ws_send() {
    local payload=$1 len=${#1} header
    if ((len < 126)); then
        header=$(printf '\\x81\\x%02x' $((0x80 | len)))
    else
        header=$(printf '\\x81\\xfe\\x%02x\\x%02x' $((len >> 8)) $((len & 255)))
    fi
    printf "$header\\x00\\x00\\x00\\x00" >&"$WS"
    printf '%s' "$payload" >&"$WS"
}
# Reads the next relay message up to its first ']' (enough to recognise
# EOSE and OK); the frame header bytes before it are ignored by the caller.
# The NIP-42 AUTH challenge the relay sends at connect is skipped.
ws_read() {
    while true; do
        IFS= read -r -t 10 -d ']' REPLY <&"$WS" || fail "no reply from the relay"
        [[ $REPLY == *'["AUTH",'* ]] || return 0
    done
}

exec {WS}<>"/dev/tcp/127.0.0.1/$PORT"
printf 'GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: c2x1aWNlLWNpLWNoZWNrIQ==\r\nSec-WebSocket-Version: 13\r\n\r\n' "$ADDR" >&"$WS"
IFS= read -r -t 10 status <&"$WS" || fail "no answer to the WebSocket upgrade"
[[ $status == "HTTP/1.1 101"* ]] || fail "WebSocket upgrade answered: $status"
while IFS= read -r -t 10 line <&"$WS" && [[ $line != $'\r' ]]; do :; done

ws_send '["REQ","ci",{"ids":["0000000000000000000000000000000000000000000000000000000000000000"]}]'
ws_read
[[ $REPLY == *'["EOSE","ci"' ]] || fail "expected EOSE, got: $REPLY"

# One real signed event from the fixture (a kind 1 note without expiration).
EVENT=$(awk '/"kind":1,/ && !/"expiration"/ { print; exit }' tests/fixtures/real-events.jsonl)
[[ -n $EVENT ]] || fail "no kind 1 event in tests/fixtures/real-events.jsonl"
EVENT_ID=$(jq -r .id <<<"$EVENT")
ws_send "[\"EVENT\",$EVENT]"
ws_read
[[ $REPLY == *"[\"OK\",\"$EVENT_ID\",true,\"\"" ]] || fail "expected OK true, got: $REPLY"
say "stored event $EVENT_ID over WebSocket; subscription ci open"

# --- 3. promtool check metrics on a real scrape -----------------------------------
sampled() {
    curl -sf "http://$ADDR/metrics" >"$WORK/scrape.txt" &&
        grep -q '^sluice_connections_open 1$' "$WORK/scrape.txt" &&
        grep -q '^sluice_store_events 1$' "$WORK/scrape.txt"
}
retry sampled || fail "the scrape never showed the open connection and the stored event"
for want in \
    'sluice_build_info{version="[^"]*"} 1' \
    'sluice_subscriptions_open 1' \
    'sluice_events_accepted_total{outcome="stored"} 1' \
    'sluice_ok_latency_seconds_bucket{le="+Inf"} 1' \
    'sluice_ok_latency_seconds_count 1' \
    'sluice_writer_commit_seconds_count [1-9]' \
    'sluice_query_seconds_count [1-9]'; do
    grep -q "^$want" "$WORK/scrape.txt" || fail "scrape lacks: $want"
done
# promtool exits 3 for lint problems only (1 for a parse error). The relay
# registers no HELP text, so "no help text" is expected; anything else fails.
set +e
promtool check metrics <"$WORK/scrape.txt" >"$WORK/lint.txt" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 3 ]] || { cat "$WORK/lint.txt"; fail "promtool check metrics could not parse the scrape"; }
    if grep -v ' no help text$' "$WORK/lint.txt" | grep -q .; then
        cat "$WORK/lint.txt"
        fail "promtool check metrics found problems"
    fi
fi
say "promtool check metrics: $(grep -c '^# TYPE' "$WORK/scrape.txt") metric families parse ($(wc -l <"$WORK/lint.txt") without HELP text)"

# --- 4. a real Prometheus ---------------------------------------------------------
# A port is free when nothing accepts a connection on it; Prometheus is retried
# on another one should it lose the race for it anyway.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
mkdir -p "$WORK/prom"
cp deploy/prometheus/alerts.yml "$WORK/prom/"
sed -e "s|\"sluice:7777\"|\"$ADDR\"|" \
    -e 's|^\(  *\)scrape_interval: .*|\1scrape_interval: 1s|' \
    -e 's|^\(  *\)evaluation_interval: .*|\1evaluation_interval: 1s|' \
    -e 's|^\(  *\)scrape_timeout: .*|\1scrape_timeout: 1s|' \
    deploy/prometheus/prometheus.yml >"$WORK/prom/prometheus.yml"
grep -q "\"$ADDR\"" "$WORK/prom/prometheus.yml" || fail "deploy/prometheus/prometheus.yml has no \"sluice:7777\" target to point at the relay"
promtool check config "$WORK/prom/prometheus.yml" >/dev/null

# Waits for /-/ready, giving up at once if Prometheus exits (port taken).
prom_up() {
    for ((i = 0; i < 300; i++)); do
        kill -0 "$PROM_PID" 2>/dev/null || return 1
        curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null && return 0
        sleep 0.1
    done
    return 1
}
for attempt in 1 2 3 4 5; do
    PROM_PORT=$((20000 + RANDOM % 12000))
    port_free "$PROM_PORT" || continue
    prometheus \
        --config.file="$WORK/prom/prometheus.yml" \
        --storage.tsdb.path="$WORK/prom/data" \
        --web.listen-address="127.0.0.1:$PROM_PORT" \
        --log.level=warn >"$WORK/prometheus.log" 2>&1 &
    PROM_PID=$!
    if prom_up; then break; fi
    wait "$PROM_PID" 2>/dev/null || true
    PROM_PID=
done
[[ -n $PROM_PID ]] || fail "Prometheus did not start"
say "prometheus on 127.0.0.1:$PROM_PORT scraping $ADDR"
API="http://127.0.0.1:$PROM_PORT/api/v1"

# query EXPR: the instant result of EXPR, as JSON.
query() { curl -sf "$API/query" --data-urlencode "query=$1"; }
target_up() {
    curl -sf "$API/targets" | jq -e --arg a "$ADDR" \
        '.data.activeTargets | any(.labels.instance == $a and .labels.job == "sluice" and .health == "up")' >/dev/null
}
retry target_up || { curl -s "$API/targets" | jq .; fail "the sluice target is not up in Prometheus"; }
has_value() { query "$1" | jq -e --arg v "$2" '.data.result | length > 0 and all(.value[1] == $v)' >/dev/null; }
for pair in \
    'up{job="sluice"}=1' \
    'sluice_build_info=1' \
    'sluice_connections_open=1' \
    'sluice_subscriptions_open=1' \
    'sluice_store_events=1' \
    'sluice_events_accepted_total{outcome="stored"}=1' \
    'sluice_ok_latency_seconds_count=1' \
    'sluice_throttle_emergency=0' \
    'count(sluice_throttle_mode == 1)=1'; do
    expr=${pair%=*} value=${pair##*=}
    retry has_value "$expr" "$value" || fail "Prometheus: $expr is not $value: $(query "$expr")"
done
series=$(curl -sf "$API/label/__name__/values" | jq -r '[.data[] | select(startswith("sluice_"))] | length')
say "target up; $series sluice_ series in Prometheus"

# Every rule evaluated at least once and none in error; SluiceDown not firing.
rules_evaluated() {
    curl -sf "$API/rules" | jq -e '[.data.groups[].rules[]] | length > 0 and all(.lastEvaluation | startswith("0001") | not)' >/dev/null
}
retry rules_evaluated || fail "the alert rules were never evaluated"
bad=$(curl -sf "$API/rules" | jq -r '.data.groups[].rules[] | select(.health != "ok") | "\(.name): \(.lastError)"')
[[ -z $bad ]] || fail "alert rules in error: $bad"
rules=$(curl -sf "$API/rules" | jq '[.data.groups[].rules[]] | length')
firing=$(curl -sf "$API/alerts" | jq -r '[.data.alerts[] | select(.state == "firing") | .labels.alertname] | join(",")')
[[ $firing != *SluiceDown* ]] || fail "SluiceDown fires against a running relay"
say "$rules alert rules evaluated, all healthy; firing: ${firing:-none}"

# Every query of the Grafana dashboard, with its variables filled in as
# Grafana would, is accepted by Prometheus.
n=0
while IFS= read -r expr; do
    q=${expr//\$__rate_interval/1m}
    q=${q//\$__interval/15s}
    q=${q//\$__range/5m}
    q=${q//\$instance/.+}
    q=${q//\$job/sluice}
    out=$(curl -s "$API/query" --data-urlencode "query=$q")
    [[ $out == '{"status":"success"'* ]] || fail "dashboard query rejected: $expr -> $out"
    n=$((n + 1))
done < <(jq -r '[.. | objects | select(has("expr")) | .expr] | unique[]' "$DASHBOARD")
((n > 0)) || fail "no queries found in $DASHBOARD"
say "$n dashboard queries accepted by Prometheus"

# --- graceful stop ---------------------------------------------------------------------
exec {WS}>&-
WS=
kill -TERM "$SLUICE_PID"
# Gone, or a zombie waiting for `wait`: either way it has finished.
exited() {
    local pid state
    [[ -r /proc/$SLUICE_PID/stat ]] || return 0
    read -r pid _ state _ <"/proc/$SLUICE_PID/stat" || return 0
    [[ $state == Z ]]
}
TRIES=150 retry exited || fail "sluice did not stop within 15 s of SIGTERM"
set +e
wait "$SLUICE_PID"
rc=$?
set -e
SLUICE_PID=
[[ $rc -eq 0 ]] || fail "sluice exited $rc on SIGTERM"
say "sluice stopped on SIGTERM with exit 0"
say "OK"
