#!/usr/bin/env node
// The README's nightly report as a long-lived Node worker: `shardctl executor --worker "node
// examples/report/worker.js" --aggregate-worker "node examples/report/worker.js"`. The same
// report as worker.py: each shard is the rows [start, end), each "row" its number; a shard
// reports how many rows it read and the sum of the multiples of the payload's `every`.
'use strict';
const path = require('node:path');

let serve;
try {
  ({ serve } = require('shardctl-worker'));
} catch (e) {
  // run from a checkout, without `npm install ./clients/node`
  ({ serve } = require(path.join(__dirname, '..', '..', 'clients', 'node')));
}

function handle(shard) {
  const every = Number((shard.payload || {}).every || 7);
  const first = shard.start + ((every - (shard.start % every)) % every);
  let picked = 0;
  let sum = 0;
  for (let n = first; n < shard.end; n += every) {
    picked += 1;
    sum += n;
  }
  return { rows: shard.end - shard.start, picked, sum };
}

async function aggregate(agg) {
  let rows = 0;
  let picked = 0;
  let sum = 0;
  const failed = [];
  for await (const o of agg.outcomes) {
    if (o.error !== null) {
      failed.push(o.shard);
      continue;
    }
    const r = o.result;
    if (!r || typeof r.rows !== 'number' || typeof r.picked !== 'number' || typeof r.sum !== 'number') {
      // a result this report cannot read is not counted as 0
      throw new Error(`shard ${o.shard} returned ${JSON.stringify(r)}, not a report`);
    }
    rows += r.rows;
    picked += r.picked;
    sum += r.sum;
  }
  return { task: agg.task_id, rows, picked, sum, failed_shards: failed };
}

if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log('the README\'s report as a Node worker\n\nusage: shardctl executor --worker "node ' + __filename +
    '" --kinds report --aggregate-worker "node ' + __filename + '"');
} else {
  serve(handle, aggregate);
}
