'use strict';
// The Node worker library against the protocol, with the real interpreter: each test starts a
// worker process (`node -e ...`) and speaks protocol 1 to it over pipes, as the executor does.
const { test } = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');

const LIB = path.resolve(__dirname, '..');

function start(body, env = {}) {
  const code = `const { serve } = require(${JSON.stringify(LIB)});\n${body}`;
  const p = spawn(process.execPath, ['-e', code], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  const lines = readline.createInterface({ input: p.stdout });
  const queue = [];
  let waiting = null;
  lines.on('line', (l) => {
    const m = JSON.parse(l);
    if (waiting) { const w = waiting; waiting = null; w(m); } else queue.push(m);
  });
  let stderr = '';
  p.stderr.on('data', (d) => { stderr += d; });
  return {
    p,
    send: (m) => p.stdin.write(JSON.stringify(m) + '\n'),
    read: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => { waiting = r; })),
    stderr: () => stderr,
    done: () => new Promise((r) => { if (p.exitCode !== null) r(p.exitCode); else p.on('exit', (c) => r(c)); }),
  };
}

function shard(i, extra = {}) {
  return { type: 'shard', id: i, task_id: 't', kind: 'k', index: i, total: 10, start: i * 10, end: i * 10 + 10,
    key: String(i), attempt: 1, payload: { x: 1 }, ...extra };
}

async function worker(t, body, env = {}) {
  const w = start(body, env);
  t.after(() => w.p.kill('SIGKILL'));
  assert.deepStrictEqual(await w.read(), { type: 'hello', protocol: 1 });
  return w;
}

test('results, errors and the shard fields, sync and async handlers', async (t) => {
  const w = await worker(t, `
    serve(async (s) => {
      if (s.index === 2) throw new TypeError('no good');
      if (s.index === 3) return new Promise((r) => setTimeout(() => r('later'), 20));
      return [s.task_id, s.kind, s.index, s.total, s.start, s.end, s.key, s.attempt, s.payload];
    });`);
  w.send(shard(1));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 1, result: ['t', 'k', 1, 10, 10, 20, '1', 1, { x: 1 }] });
  w.send(shard(2));
  const r = await w.read();
  assert.deepStrictEqual([r.type, r.id, r.error, r.class], ['error', 2, 'TypeError: no good', undefined]);
  // the stack comes along: the message, then the frames
  assert.match(r.traceback, /^TypeError: no good\n\s+at /);
  w.send(shard(3));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 3, result: 'later' });
});

test('failures carry their class', async (t) => {
  const w = await worker(t, `
    const { Permanent, RetryAfter, FailTask } = require(${JSON.stringify(LIB)});
    serve(async (s) => {
      if (s.index === 1) throw new Permanent('malformed date in row ' + s.start);
      if (s.index === 2) throw new RetryAfter(1.5, '429 from the API');
      if (s.index === 3) throw new FailTask('no API_TOKEN');
      if (s.index === 4) throw new RetryAfter('soon');
      throw new Error('x'.repeat(6000));
    });`);
  w.send(shard(1));
  let r = await w.read();
  assert.deepStrictEqual([r.class, r.error], ['permanent', 'Permanent: malformed date in row 10']);
  w.send(shard(2));
  r = await w.read();
  assert.deepStrictEqual([r.class, r.retry_after_ms, r.error], ['retry_after', 1500, 'RetryAfter: 429 from the API']);
  w.send(shard(3));
  assert.strictEqual((await w.read()).class, 'fail_task');
  // a RetryAfter without a number is the handler's own error: a plain failure that says so
  w.send(shard(4));
  r = await w.read();
  assert.strictEqual(r.class, undefined);
  assert.match(r.error, /RetryAfter takes a finite number of seconds/);
  // a long stack is cut to its head (the message and the innermost frames)
  w.send(shard(5));
  r = await w.read();
  assert.ok(r.traceback.length <= 4096 + 4, r.traceback.length);
  assert.ok(r.traceback.startsWith('Error: xxx') && r.traceback.endsWith('\n...'));
});

test('console.log and process.stdout.write go to stderr, not into the protocol', async (t) => {
  const w = await worker(t, `serve((s) => { console.log('from log'); process.stdout.write('raw\\n'); return 'ok'; });`);
  w.send(shard(1));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 1, result: 'ok' });
  w.p.stdin.end();
  assert.strictEqual(await w.done(), 0);
  assert.match(w.stderr(), /from log/);
  assert.match(w.stderr(), /raw/);
});

test('a cancel aborts the running handler', async (t) => {
  const w = await worker(t, `
    serve((s) => new Promise((resolve) => {
      const deadline = setTimeout(() => resolve('finished'), 20000);
      s.signal.addEventListener('abort', () => { clearTimeout(deadline); resolve('saw the cancel: ' + s.cancelled()); });
    }));`);
  w.send(shard(1));
  await new Promise((r) => setTimeout(r, 100));
  w.send({ type: 'cancel', id: 1 });
  assert.deepStrictEqual(await w.read(), { type: 'error', id: 1, error: 'cancelled' });
});

test('an aggregation streams its outcomes', async (t) => {
  const w = await worker(t, `
    serve(() => null, async (a) => {
      const seen = [];
      for await (const o of a.outcomes) seen.push(o.error === null ? o.result : 'failed: ' + o.error);
      return { task: a.task_id, done: a.done, failed: a.failed, seen };
    });`);
  w.send({ type: 'aggregate', id: 5, task_id: 't', kind: 'k', total: 3, done: 2, failed: 1, attempt: 1, payload: null });
  w.send({ type: 'outcome', id: 5, shard: 0, result: 10 });
  w.send({ type: 'outcome', id: 5, shard: 1, error: 'bad' });
  w.send({ type: 'outcome', id: 5, shard: 2, result: 12 });
  w.send({ type: 'end', id: 5 });
  assert.deepStrictEqual(await w.read(),
    { type: 'result', id: 5, result: { task: 't', done: 2, failed: 1, seen: [10, 'failed: bad', 12] } });
  w.send(shard(6));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 6, result: null });
});

test('a result that is not JSON fails the shard, not the worker', async (t) => {
  const w = await worker(t, `serve((s) => (s.index === 1 ? { big: 10n } : s.index));`);
  w.send(shard(1));
  const r = await w.read();
  assert.strictEqual(r.type, 'error');
  assert.match(r.error, /BigInt/);
  w.send(shard(2));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 2, result: 2 });
});

test('the end of stdin ends the worker', async (t) => {
  const w = await worker(t, `serve(() => 1);`);
  w.p.stdin.end();
  assert.strictEqual(await w.done(), 0);
});

test('under an executor, a console.log before serve() goes to stderr, the hello comes first', async (t) => {
  const w = await worker(t, `
    console.log('Loading model...');
    process.stdout.write('a banner\\n');
    serve((s) => s.index);`, { SHARDCTL_WORKER_PROTOCOL: '1' });
  w.send(shard(1));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 1, result: 1 });
  assert.match(w.stderr(), /Loading model\.\.\./);
  assert.match(w.stderr(), /a banner/);
});

test('maxRequests recycles the worker: its last reply says so and it exits', async (t) => {
  const w = await worker(t, 'serve((s) => s.index, undefined, { maxRequests: 2 });');
  w.send(shard(1));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 1, result: 1 });
  w.send(shard(2));
  assert.deepStrictEqual(await w.read(), { type: 'result', id: 2, result: 2, retire: true });
  assert.strictEqual(await w.done(), 0);
});

test('a running handler sends signs of life, and none after its reply', async (t) => {
  const w = await worker(t, `
    serve((s) => new Promise((r) => setTimeout(() => r(s.index), 600)));`, { SHARDCTL_WORKER_SILENCE_MS: '400' });
  w.send(shard(1));
  const lines = [];
  while (!lines.length || lines[lines.length - 1].type !== 'result') lines.push(await w.read());
  assert.ok(lines.length >= 3, JSON.stringify(lines));
  for (const m of lines.slice(0, -1)) assert.deepStrictEqual(m, { type: 'alive', id: 1 });
  await new Promise((r) => setTimeout(r, 400));
  w.send(shard(2));
  assert.strictEqual((await w.read()).id, 2);
});
