#!/usr/bin/env python3
"""One shard of the README's nightly report, run by `shardctl executor --exec`.

The shard is the rows [SHARDCTL_RANGE_START, SHARDCTL_RANGE_END); the task payload (JSON) is on
stdin. Here each "row" is its number: the shard reports how many rows it read and the sum of
those whose number is a multiple of the payload's `every` (a stand-in for reading a table).
The result is one JSON document on stdout; a non-zero exit fails the attempt (it is retried).
"""
import json
import os
import sys

# a task dispatched without --payload gets `null`
payload = (json.load(sys.stdin) if not sys.stdin.isatty() else None) or {}
every = int(payload.get("every", 7))
start = int(os.environ["SHARDCTL_RANGE_START"])
end = int(os.environ["SHARDCTL_RANGE_END"])

first = start + (-start % every)  # the first multiple of `every` at or after start
picked = range(first, end, every)
print(json.dumps({"rows": end - start, "picked": len(picked), "sum": sum(picked)}))
