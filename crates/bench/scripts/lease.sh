#!/usr/bin/env bash
# Leased budgets, measured: Redis cut from all three Sluice nodes for
# OUTAGE seconds (default 30) while one address floods every node with
# EVENTs against a global per-address limit of 20/s. Each node and Redis
# runs in its own network namespace (tests/partition.rs,
# tests/support/netns.rs); needs root, iproute2, redis-server.
#
# Prints the EVENTs accepted during the outage against one node's limit
# over it (rate × outage + its pool), then PASS (at most 1.3 × that) or
# FAIL.
#
#   sudo crates/bench/scripts/lease.sh               # 30 s outage
#   OUTAGE=60 PROFILE=debug crates/bench/scripts/lease.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUTAGE=${OUTAGE:-30}
PROFILE=${PROFILE:-release}
flag=()
[ "$PROFILE" = release ] && flag=(--release)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
PARTITION_TESTS_REQUIRE=1 SLUICE_LEASE_OUTAGE_SECS=$OUTAGE \
  cargo test "${flag[@]}" -p sluice --test partition \
  a_flood_while_redis_is_unreachable_takes_about_one_node_s_limit \
  -- --nocapture --exact >"$log" 2>&1
rc=$?
grep '^leases:' "$log"
if [ "$rc" -eq 0 ]; then
  echo PASS
else
  grep -E 'panicked|accepted in|refused nothing' "$log" | head -5
  echo FAIL
  exit 1
fi
