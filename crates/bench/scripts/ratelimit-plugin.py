#!/usr/bin/env python3
# A strfry write-policy plugin that rate-limits EVENTs with a token bucket per source address
# (strfry's plugin protocol: one JSON request per line on stdin, {"type":"new","event":{...},
# "sourceType":"IP4","sourceInfo":"127.0.0.1",...}; one answer per line on stdout,
# {"id":...,"action":"accept"|"reject","msg":...}). An EVENT over the rate is answered
# `rate-limited: ...`, as Sluice answers it. Used by crates/bench/scripts/upload.sh.
#   ratelimit-plugin.py [RATE_PER_S [BURST]]     (defaults: 20 per second, a burst of RATE)
#   ratelimit-plugin.py 20 20 --overall           one bucket for every address together
import json
import sys
import time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
rate = float(args[0]) if args else 20.0
burst = float(args[1]) if len(args) > 1 else rate
overall = "--overall" in sys.argv
buckets = {}  # address -> (tokens, last refill, monotonic seconds)

for line in sys.stdin:
    try:
        req = json.loads(line)
    except ValueError:
        continue
    event_id = req.get("event", {}).get("id", "")
    key = "" if overall else req.get("sourceInfo", "")
    now = time.monotonic()
    tokens, last = buckets.get(key, (burst, now))
    tokens = min(burst, tokens + (now - last) * rate)
    if tokens >= 1.0:
        tokens -= 1.0
        answer = {"id": event_id, "action": "accept"}
    else:
        wait = (1.0 - tokens) / rate
        answer = {
            "id": event_id,
            "action": "reject",
            "msg": "rate-limited: %g EVENTs/s per address, retry in %.2f s" % (rate, wait),
        }
    buckets[key] = (tokens, now)
    if len(buckets) > 100000:  # bounded: forget the idlest half
        for k, _ in sorted(buckets.items(), key=lambda kv: kv[1][1])[:50000]:
            del buckets[k]
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
