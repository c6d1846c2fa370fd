#!/usr/bin/env bash
# Redis failover through Sentinel, measured: the Redis primary SIGKILLed
# while three Sluice nodes take EVENTs, ROUNDS times (default 20) at RATE
# EVENTs/s in all (default 200). Each node, each Redis server and each
# Sentinel runs in its own network namespace (tests/partition.rs,
# tests/support/netns.rs); needs root, iproute2, redis-server.
#
# Prints, per round, how long after the kill cross-node live delivery
# resumed and when every acknowledged event was on every node, then
# PASS (every round resumed within 10 s and converged within 30 s) or FAIL.
#
#   sudo crates/bench/scripts/failover.sh            # 20 rounds, 200/s
#   ROUNDS=5 RATE=50 crates/bench/scripts/failover.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-20}
RATE=${RATE:-200}
PROFILE=${PROFILE:-release}
flag=()
[ "$PROFILE" = release ] && flag=(--release)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
PARTITION_TESTS_REQUIRE=1 SLUICE_FAILOVER_ROUNDS=$ROUNDS SLUICE_FAILOVER_RATE=$RATE \
  cargo test "${flag[@]}" -p sluice --test partition the_cluster_follows_a_sentinel_failover \
  -- --nocapture --exact >"$log" 2>&1
rc=$?
grep '^failover round' "$log" | sed 's/^failover //'
passed=$(grep -c '^failover round' "$log")
echo "rounds passed: $passed of $ROUNDS at $RATE EVENTs/s"
if [ "$rc" -eq 0 ] && [ "$passed" -eq "$ROUNDS" ]; then
  echo PASS
else
  grep -E 'panicked|timed out|not converged|did not resume' "$log" | head -5
  echo FAIL
  exit 1
fi
