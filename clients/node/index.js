'use strict';
/**
 * Run shardctl shards in a long-lived Node process: the `--worker` protocol, version 1
 * (docs/handlers.md). `serve(handler, aggregator)` says hello on stdout, then answers the
 * executor's requests one at a time: `handler(shard)` for a shard, `aggregator(agg)` for an
 * aggregation. Either may be async. A returned value is the result (JSON-able); a throw or a
 * rejection fails the attempt with its message and stack (its first 4 KiB), retried after the
 * task's backoff. Throw `Permanent` for a failure no attempt can mend (the shard fails for good
 * now), `RetryAfter(seconds)` when an upstream asks to come back later (no attempt used),
 * `FailTask` for a fatal error of the whole task (it fails at once). A cancel (the shard's lock lost, its task
 * cancelled, its timeout passed) sets `shard.cancelled()` and aborts `shard.signal`; the
 * executor kills the worker if it does not answer within 2 s.
 *
 * Under an executor (`SHARDCTL_WORKER_PROTOCOL` set), from the moment this module is loaded
 * `console.log` and `process.stdout.write` write to stderr: stdout carries the protocol only,
 * so a log line before `serve()` cannot break it. While a handler runs, a sign of life is sent
 * every quarter of `SHARDCTL_WORKER_SILENCE_MS`. `serve(h, a, { maxRequests: N })` recycles the
 * worker after N requests (its last reply says so; the executor starts a fresh one). A lone
 * surrogate in a result is written as `JSON.stringify` writes it (`"\ud83d"`), which the
 * executor reads as U+FFFD. No dependencies.
 */

const readline = require('node:readline');

const PROTOCOL = 1;

/** The most of a stack sent (its head: the message and the innermost frames). */
const STACK_BYTES = 4096;

/** The shard fails for good now, whatever attempts are left (malformed input). */
class Permanent extends Error {
  get name() { return 'Permanent'; }
  get failureClass() { return 'permanent'; }
}

/** Not now: the next attempt not before `seconds` (an upstream answered 429); no attempt used. */
class RetryAfter extends Error {
  constructor(seconds, message) {
    if (typeof seconds !== 'number' || !(seconds >= 0) || !Number.isFinite(seconds)) {
      throw new TypeError(`RetryAfter takes a finite number of seconds >= 0, not ${String(seconds)}`);
    }
    super(message || `retry after ${seconds}s`);
    this.seconds = seconds;
  }
  get name() { return 'RetryAfter'; }
  get failureClass() { return 'retry_after'; }
}

/** A fatal error of the whole task (a missing credential): the task fails at once. */
class FailTask extends Error {
  get name() { return 'FailTask'; }
  get failureClass() { return 'fail_task'; }
}

let protocolWrite = null;

/** The protocol's writer (stdout's own); console.log and process.stdout.write go to stderr. */
function claimStdout() {
  if (!protocolWrite) {
    protocolWrite = process.stdout.write.bind(process.stdout);
    process.stdout.write = process.stderr.write.bind(process.stderr);
    const err = console.error.bind(console);
    console.log = err;
    console.info = err;
    console.debug = err;
  }
  return protocolWrite;
}

if (process.env.SHARDCTL_WORKER_PROTOCOL) claimStdout();

class Shard {
  constructor(msg, controller) {
    this.taskId = msg.task_id;
    this.task_id = msg.task_id;
    this.kind = msg.kind;
    this.index = msg.index;
    this.total = msg.total;
    this.start = msg.start;
    this.end = msg.end;
    this.key = msg.key;
    this.attempt = msg.attempt;
    this.payload = msg.payload === undefined ? null : msg.payload;
    /** Aborted when the executor asks this shard to stop. */
    this.signal = controller.signal;
  }

  /** True once the executor asked this shard to stop. */
  cancelled() {
    return this.signal.aborted;
  }
}

class Aggregation {
  constructor(msg, controller, outcomes) {
    this.taskId = msg.task_id;
    this.task_id = msg.task_id;
    this.kind = msg.kind;
    this.total = msg.total;
    this.done = msg.done;
    this.failed = msg.failed;
    /** k-of-n (--success-when): shards cancelled once the task met its goal (no outcome). */
    this.cancelled = msg.cancelled || 0;
    this.attempt = msg.attempt;
    this.payload = msg.payload === undefined ? null : msg.payload;
    this.signal = controller.signal;
    /**
     * The shards' outcomes in shard order, `{shard, result, error}` (`error` is null for a
     * completed shard), read from the executor as they are consumed: `for await (const o of
     * agg.outcomes)`.
     */
    this.outcomes = outcomes;
  }

  cancelled() {
    return this.signal.aborted;
  }
}

/** An async queue of the outcome lines of one aggregation. */
class Lines {
  constructor() {
    this.items = [];
    this.waiting = null;
    this.ended = false;
  }

  push(item) {
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = null;
      w(item);
    } else {
      this.items.push(item);
    }
  }

  next() {
    if (this.items.length) return Promise.resolve(this.items.shift());
    return new Promise((resolve) => { this.waiting = resolve; });
  }

  async *[Symbol.asyncIterator]() {
    while (!this.ended) {
      const m = await this.next();
      if (m === null || m.type === 'end') {
        this.ended = true;
        return;
      }
      yield { shard: m.shard, result: m.result === undefined ? null : m.result, error: m.error === undefined ? null : m.error };
    }
  }

  async drain() {
    // eslint-disable-next-line no-unused-vars
    for await (const _ of this) { /* the rest of the outcomes */ }
  }
}

function reason(e) {
  if (e instanceof Error) return e.message ? `${e.name}: ${e.message}` : e.name;
  return String(e);
}

/** The error reply for `e`: its reason, its stack (bounded), its class. */
function errorReply(id, e) {
  const reply = { type: 'error', id, error: reason(e) };
  if (e instanceof Error && typeof e.stack === 'string') {
    // V8 lists the message and the innermost frames first: the head is kept
    reply.traceback = e.stack.length > STACK_BYTES ? e.stack.slice(0, STACK_BYTES) + '\n...' : e.stack;
  }
  const cls = e instanceof Error ? e.failureClass : undefined;
  if (cls === 'permanent' || cls === 'retry_after' || cls === 'fail_task') {
    reply.class = cls;
    // the executor cuts a delay to 24 h: so is it here
    if (cls === 'retry_after') reply.retry_after_ms = Math.round(Math.min(e.seconds, 86400) * 1000);
  }
  return reply;
}

/**
 * Answers the executor's requests until it closes stdin; resolves then.
 * @param {(shard: Shard) => any} handler
 * @param {(agg: Aggregation) => any} [aggregator]
 * @param {{input?: NodeJS.ReadableStream, output?: NodeJS.WritableStream, maxRequests?: number}} [io]
 *   `maxRequests`: answer that many requests, then resolve (the last reply tells the executor)
 */
function serve(handler, aggregator, io = {}) {
  const input = io.input || process.stdin;
  const maxRequests = io.maxRequests === undefined ? null : io.maxRequests;
  if (maxRequests !== null && !(Number.isInteger(maxRequests) && maxRequests >= 1)) {
    throw new RangeError(`maxRequests must be a positive integer, not ${maxRequests}`);
  }
  // the protocol keeps stdout's writer; console.log and process.stdout.write in a handler go
  // to stderr, so that they cannot break the protocol (a child process started with
  // stdio 'inherit' still shares fd 1: give it 'pipe' or 'ignore')
  const write = io.output ? io.output.write.bind(io.output) : claimStdout();
  const silence = Number(process.env.SHARDCTL_WORKER_SILENCE_MS || 0);
  const aliveEvery = silence > 0 ? Math.max(silence / 4, 50) : 0;
  const output = { write };
  const send = (m) => output.write(JSON.stringify(m) + '\n');
  send({ type: 'hello', protocol: PROTOCOL });

  const requests = [];
  let wake = null;
  let closed = false;
  let current = null; // { id, controller, lines }

  const rl = readline.createInterface({ input, crlfDelay: Infinity });
  rl.on('line', (raw) => {
    const text = raw.trim();
    if (!text) return;
    let m;
    try {
      m = JSON.parse(text);
    } catch (e) {
      process.stderr.write(`shardctl-worker: a line that is not JSON from the executor: ${text.slice(0, 200)}\n`);
      return;
    }
    if (m.type === 'shard' || m.type === 'aggregate') {
      const controller = new AbortController();
      const lines = m.type === 'aggregate' ? new Lines() : null;
      current = { id: m.id, controller, lines };
      requests.push({ m, controller, lines });
      if (wake) { const w = wake; wake = null; w(); }
    } else if (m.type === 'outcome' || m.type === 'end') {
      if (current && current.lines && current.id === m.id) current.lines.push(m);
    } else if (m.type === 'cancel') {
      if (current && current.id === m.id) {
        current.controller.abort();
        if (current.lines) current.lines.push(null);
      }
    }
  });
  rl.on('close', () => {
    closed = true;
    if (wake) { const w = wake; wake = null; w(); }
  });

  let answered = 0;
  return (async () => {
    for (;;) {
      if (maxRequests !== null && answered >= maxRequests) {
        rl.close();
        if (input === process.stdin) input.destroy();
        return;
      }
      if (!requests.length) {
        if (closed) return;
        await new Promise((resolve) => { wake = resolve; });
        continue;
      }
      const { m, controller, lines } = requests.shift();
      answered += 1;
      const last = maxRequests !== null && answered >= maxRequests;
      // signs of life while the handler runs; none once its reply is written
      const alive = aliveEvery ? setInterval(() => send({ type: 'alive', id: m.id }), aliveEvery) : null;
      let reply;
      try {
        let result;
        if (m.type === 'shard') {
          result = await handler(new Shard(m, controller));
        } else {
          if (!aggregator) throw new Error('this worker has no aggregator');
          try {
            result = await aggregator(new Aggregation(m, controller, lines));
          } finally {
            await lines.drain();
          }
        }
        if (controller.signal.aborted) {
          reply = { type: 'error', id: m.id, error: 'cancelled' };
        } else {
          const json = JSON.stringify(result === undefined ? null : result);
          reply = json === undefined
            ? { type: 'error', id: m.id, error: 'the result is not JSON' }
            : `{"type":"result","id":${JSON.stringify(m.id)},"result":${json}${last ? ',"retire":true' : ''}}`;
        }
      } catch (e) {
        if (m.type === 'aggregate' && lines) await lines.drain();
        reply = controller.signal.aborted ? { type: 'error', id: m.id, error: 'cancelled' } : errorReply(m.id, e);
      }
      if (alive) clearInterval(alive);
      if (typeof reply !== 'string' && last) reply.retire = true;
      if (typeof reply === 'string') output.write(reply + '\n');
      else send(reply);
      if (current && current.id === m.id) current = null;
    }
  })();
}

module.exports = { serve, Shard, Aggregation, Permanent, RetryAfter, FailTask, PROTOCOL };
