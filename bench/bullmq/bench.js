#!/usr/bin/env node
/*
 * The BullMQ side of `shardctl bench` (see src/cli/bench.rs): BullMQ's best case on the same
 * redis-server as shardctl's figures.
 *
 *   1. bulk-add BENCH_JOBS no-op jobs (`addBulk` in chunks of 1000, removeOnComplete: true);
 *   2. one Worker with concurrency BENCH_CONCURRENCY (200) and a processor that returns at once
 *      processes them all.
 *
 * Redis figures come from INFO before and after each phase: CPU (used_cpu_user + used_cpu_sys),
 * commands (the `calls` of INFO commandstats, commands run inside scripts included, the bench's
 * own INFO and CONFIG left out) and used_memory after adding (the memory of the waiting jobs).
 * Prints one JSON line on stdout; progress and errors go to stderr.
 *
 * `shardctl bench` installs bullmq and runs this by itself. By hand, against an EMPTY database
 * (it resets the server's INFO stats):
 *
 *   npm install --prefix /tmp/shardctl-bullmq bullmq@6 ioredis@5
 *   BENCH_REDIS_URL=redis://127.0.0.1:6379 BENCH_JOBS=200000 node bench/bullmq/bench.js
 *
 * Environment: BENCH_REDIS_URL (or BENCH_REDIS_PORT on 127.0.0.1), BENCH_JOBS (200000),
 * BENCH_CONCURRENCY (200), BULLMQ_DIR (/tmp/shardctl-bullmq: where node_modules/bullmq
 * and node_modules/ioredis are; BullMQ 6 takes ioredis as an optional peer dependency).
 */
'use strict';

const fs = require('fs');
const path = require('path');

const dir = process.env.BULLMQ_DIR || '/tmp/shardctl-bullmq';
const load = (name) => require(require.resolve(name, { paths: [dir, __dirname] }));
const { Queue, Worker } = load('bullmq');
const IORedis = load('ioredis');

const url = process.env.BENCH_REDIS_URL || `redis://127.0.0.1:${process.env.BENCH_REDIS_PORT || 6379}`;
const jobs = parseInt(process.env.BENCH_JOBS || '200000', 10);
const concurrency = parseInt(process.env.BENCH_CONCURRENCY || '200', 10);
const CHUNK = 1000;
const QUEUE = 'bench';

function parseInfo(text) {
  const out = { cpu: 0, memory: 0, calls: {} };
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const i = line.indexOf(':');
    if (i < 0) continue;
    const k = line.slice(0, i);
    const v = line.slice(i + 1);
    if (k === 'used_cpu_user' || k === 'used_cpu_sys') out.cpu += parseFloat(v);
    else if (k === 'used_memory') out.memory = parseInt(v, 10);
    else if (k.startsWith('cmdstat_')) {
      const m = /(?:^|,)calls=(\d+)/.exec(v);
      out.calls[k.slice(8)] = m ? parseInt(m[1], 10) : 0;
    }
  }
  return out;
}

function delta(a, b) {
  let commands = 0;
  let scripts = 0;
  for (const [name, calls] of Object.entries(b.calls)) {
    const d = calls - (a.calls[name] || 0);
    if (name === 'info' || name.startsWith('config')) continue;
    commands += d;
    if (name === 'evalsha' || name === 'eval' || name === 'evalsha_ro' || name === 'eval_ro') scripts += d;
  }
  return { cpu_us: (b.cpu - a.cpu) * 1e6, commands, scripts };
}

const seconds = (from, to) => Number(to - from) / 1e9;

async function main() {
  const options = { maxRetriesPerRequest: null };
  const admin = new IORedis(url, options);
  const info = async () => parseInfo(await admin.call('INFO', 'cpu', 'memory', 'commandstats'));

  const queue = new Queue(QUEUE, { connection: new IORedis(url, options) });
  await queue.waitUntilReady();
  await admin.call('CONFIG', 'RESETSTAT');
  const before = await info();

  const t0 = process.hrtime.bigint();
  for (let i = 0; i < jobs; i += CHUNK) {
    const n = Math.min(CHUNK, jobs - i);
    const batch = new Array(n);
    for (let j = 0; j < n; j++) batch[j] = { name: 'noop', data: {}, opts: { removeOnComplete: true } };
    await queue.addBulk(batch);
  }
  const t1 = process.hrtime.bigint();
  const added = await info();
  console.error(`bullmq: added ${jobs} jobs in ${seconds(t0, t1).toFixed(2)}s`);

  let done = 0;
  let failed = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const worker = new Worker(QUEUE, async () => null, {
    connection: new IORedis(url, options),
    concurrency,
    autorun: false,
  });
  const settle = () => {
    if (done + failed === jobs) finish();
  };
  worker.on('completed', () => {
    done += 1;
    settle();
  });
  worker.on('failed', () => {
    failed += 1;
    settle();
  });
  worker.on('error', (e) => console.error(`bullmq worker: ${e}`));
  await worker.waitUntilReady();
  const t2 = process.hrtime.bigint();
  const running = worker.run();
  await finished;
  const t3 = process.hrtime.bigint();
  const processed = await info();
  console.error(`bullmq: processed ${done} jobs (${failed} failed) in ${seconds(t2, t3).toFixed(2)}s`);
  await worker.close();
  await running;
  await queue.close();
  await admin.quit();

  const add = delta(before, added);
  const proc = delta(added, processed);
  let version = 'unknown';
  try {
    const pkg = path.join(dir, 'node_modules', 'bullmq', 'package.json');
    version = JSON.parse(fs.readFileSync(pkg, 'utf8')).version;
  } catch (_) {
    // the version is only informative
  }
  console.log(
    JSON.stringify({
      bullmq_version: version,
      jobs,
      failed,
      concurrency,
      add_secs: seconds(t0, t1),
      process_secs: seconds(t2, t3),
      add_cpu_us: add.cpu_us,
      process_cpu_us: proc.cpu_us,
      add_commands: add.commands,
      process_commands: proc.commands,
      add_scripts: add.scripts,
      process_scripts: proc.scripts,
      waiting_bytes: added.memory - before.memory,
    }),
  );
  process.exit(failed > 0 ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
