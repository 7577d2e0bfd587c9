#!/usr/bin/env python3
"""The README's nightly report as a long-lived worker: `shardctl executor --worker` (and
`--aggregate-worker`) run this file once per run slot, and it answers shard after shard.

Each shard is the rows [shard.start, shard.end); each "row" is its number here, and the shard
reports how many rows it read and the sum of those whose number is a multiple of the payload's
`every` (a stand-in for reading a table). The aggregation adds the shards' reports up.
Raising fails the attempt (it is retried after its backoff).
"""
import os
import sys

try:
    from shardctl_worker import serve
except ImportError:  # run from a checkout, without `pip install ./clients/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    from shardctl_worker import serve


def handle(shard):
    every = int((shard.payload or {}).get("every", 7))  # a task without --payload has None
    first = shard.start + (-shard.start % every)  # the first multiple of `every` at or after start
    picked = range(first, shard.end, every)
    return {"rows": shard.end - shard.start, "picked": len(picked), "sum": sum(picked)}


def aggregate(agg):
    rows = picked = total = 0
    failed = []
    for o in agg.outcomes:  # in shard order, streamed
        if o.error is not None:
            failed.append(o.shard)
            continue
        r = o.result
        if not isinstance(r, dict) or not {"rows", "picked", "sum"} <= r.keys():
            # a result this report cannot read is not counted as 0
            raise ValueError("shard %d returned %r, not a report" % (o.shard, r))
        rows += r["rows"]
        picked += r["picked"]
        total += r["sum"]
    return {"task": agg.task_id, "rows": rows, "picked": picked, "sum": total, "failed_shards": failed}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nusage: shardctl executor --worker 'python3 %s' --kinds report --aggregate-worker 'python3 %s'"
              % (sys.argv[0], sys.argv[0]))
        sys.exit(0)
    serve(handle, aggregate)
