#!/bin/bash
# NIP-50 search on a large store, in one sitting
# (docs/benchmarks.md#nip-50-search-on-the-1m-store):
# import with and without indexing (alternating, ROUNDS each), the index's
# size against data.mdb, `sluice reindex`, search latency at 4 connections
# (`sluice-bench query --mix search=1`, words drawn as often as the file's
# notes use them), and the read flood with plain and searching abusers
# (alternating) at the default config.
#
#   SLUICE=target/release/sluice BENCH=target/release/sluice-bench \
#   EVENTS=events-1m.jsonl OUT=search-run crates/bench/scripts/search.sh
#
# EVENTS: a JSONL file (the 1M one: `sluice-bench gen --count 1000000 --seed 7
# --authors 10000`). The two
# stores (about 2.4 GB each for 1M events) go under WORK (a temporary
# directory by default). Reports: OUT/*.json and OUT/*.txt; a summary on
# stdout.
set -u
SLUICE=${SLUICE:-target/release/sluice}
BENCH=${BENCH:-target/release/sluice-bench}
EVENTS=${EVENTS:?EVENTS=path/to/events.jsonl}
OUT=${OUT:-search-run}
ROUNDS=${ROUNDS:-2}
FLOODS=${FLOODS:-3}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$OUT" "$WORK"
imp() { # name search-enabled round
  rm -rf "${WORK:?}/$1"
  SLUICE_SEARCH__ENABLED=$2 SLUICE_STORE__PATH="$WORK/$1" \
    "$SLUICE" import --summary-json "$OUT/import-$1-$3.json" "$EVENTS" > "$OUT/import-$1-$3.txt" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'import {sys.argv[2]} round {sys.argv[3]}: {d[\"elapsed_secs\"]:.2f} s, {d[\"lines_per_sec\"]:.0f} lines/s')" \
    "$OUT/import-$1-$3.json" "$1" "$3"
}
for r in $(seq "$ROUNDS"); do
  imp noidx false "$r"
  imp idx true "$r"
done
du -sb "$WORK/idx/search" "$WORK/idx/data.mdb"
SLUICE_STORE__PATH="$WORK/idx" "$SLUICE" reindex --status
for r in $(seq "$ROUNDS"); do
  SLUICE_STORE__PATH="$WORK/noidx" "$SLUICE" reindex 2>&1 | tail -1
done
# Search latency: read budgets raised so that the client's own rate is
# not what is measured.
SLUICE_SERVER__LISTEN=127.0.0.1:7795 SLUICE_STORE__PATH="$WORK/idx" \
  SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S=100000 \
  SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S=100000000 \
  SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S=100000000 \
  "$SLUICE" serve > "$OUT/serve-query.log" 2>&1 &
P=$!
sleep 5
for r in 1 2 3; do
  "$BENCH" query ws://127.0.0.1:7795 --events "$EVENTS" --max-events 200000 \
    --connections 4 --duration-secs 20 --mix search=1 --limit 50 \
    --json "$OUT/query-search-$r.json" > "$OUT/query-search-$r.txt" 2>&1
  echo "search round $r: $(grep -m1 'time to EOSE' "$OUT/query-search-$r.txt")"
done
kill -INT $P; wait $P
# Read flood, default config: plain abusers, then searching ones.
for r in $(seq "$FLOODS"); do
  for kind in plain search; do
    SLUICE_SERVER__LISTEN=127.0.0.1:7796 SLUICE_STORE__PATH="$WORK/idx" \
      "$SLUICE" serve > "$OUT/serve-flood.log" 2>&1 &
    P=$!
    sleep 5
    extra=()
    [ $kind = search ] && extra=(--abusive-search the,nostr,bitcoin,relay,people,sure)
    "$BENCH" readflood ws://127.0.0.1:7796 "${extra[@]}" \
      --before-secs 5 --flood-secs 20 --after-secs 5 --pid $P \
      --json "$OUT/flood-$kind-$r.json" > "$OUT/flood-$kind-$r.txt" 2>&1
    echo "flood $kind round $r: polite REQ $(awk '/phase flood/{f=1} f&&/time to EOSE/{print; exit}' "$OUT/flood-$kind-$r.txt")"
    kill -INT $P; wait $P
  done
done
