#!/usr/bin/env bash
# Partitions, measured: three Sluice nodes and Redis, each in its own network
# namespace (tests/partition.rs, tests/support/netns.rs); node c is cut from
# Redis and both peers for CUT seconds, ROUNDS times. Both sides publish
# throughout; one side deletes (NIP-09) and the other vanishes an author
# (NIP-62), swapping each round. After each heal the history checker reads
# every node's full id set: nothing acknowledged missing, nothing deleted or
# vanished present, within 10 s of the heal. Prints each round's heal time.
# Needs root, iproute2, redis-server.
#
#   crates/bench/scripts/partition.sh                 # 20 rounds of 30 s
#   ROUNDS=5 CUT=10 crates/bench/scripts/partition.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-20}
CUT=${CUT:-30}
log=$(mktemp)
PARTITION_TESTS_REQUIRE=1 SLUICE_PARTITION_ROUNDS=$ROUNDS SLUICE_PARTITION_CUT_SECS=$CUT \
  cargo test -p sluice --test partition one_node_partitioned_round_after_round -- --nocapture \
  >"$log" 2>&1
rc=$?
grep -E "^partition" "$log" || tail -40 "$log"
if [ $rc -eq 0 ]; then echo "PASS: $ROUNDS of $ROUNDS rounds"; else echo "FAIL (see $log)"; fi
exit $rc
