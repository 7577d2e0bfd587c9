#!/usr/bin/env python3
"""The README's report aggregation, run once per task by `shardctl executor --aggregate-exec`.

stdin has one JSON line per shard in shard order: {"shard": i, "result": ...} or
{"shard": i, "error": "..."}. The task result is what this prints on stdout.
"""
import json
import os
import sys

rows = picked = total = 0
failed = []
for line in sys.stdin:
    outcome = json.loads(line)
    if "error" in outcome:
        failed.append(outcome["shard"])
        continue
    r = outcome["result"]
    rows += r["rows"]
    picked += r["picked"]
    total += r["sum"]
print(json.dumps({
    "task": os.environ["SHARDCTL_TASK_ID"],
    "rows": rows,
    "picked": picked,
    "sum": total,
    "failed_shards": failed,
}))
