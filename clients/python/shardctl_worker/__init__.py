"""Run shardctl shards in a long-lived Python process: the ``--worker`` protocol, version 1.

``serve(handler, aggregator=None)`` says hello on stdout, then answers the executor's requests
one at a time: ``handler(shard)`` for a shard, ``aggregator(aggregation)`` for an aggregation.
A handler returns any JSON-able value; an exception fails the attempt with its message and
its traceback (its last 4 KiB), retried after the task's backoff. Raise ``Permanent`` for a
failure no attempt can mend (the shard fails for good now), ``RetryAfter(seconds)`` when an
upstream asks to come back later (no attempt used), ``FailTask`` for a fatal error of the whole
task (it fails at once). A
cancel (the shard's lock lost, its task cancelled, its timeout passed) sets
``shard.cancelled()``; the executor kills the worker if it does not answer within 2 s.

Under an executor (``SHARDCTL_WORKER_PROTOCOL`` set), importing this module gives the
protocol the real stdout and makes fd 1 stderr, so that a ``print`` before ``serve`` (a model
loading, a banner) reaches the executor's log, not the protocol; while ``serve`` runs,
``sys.stdout`` is stderr and stdin is ``/dev/null``: neither a stray ``print`` nor a
subprocess can break the protocol. While a handler runs, a sign of life is sent every quarter
of ``SHARDCTL_WORKER_SILENCE_MS``. ``serve(..., max_requests=N)`` recycles the worker after N
requests (its last reply says so, and the executor starts a fresh one), as gunicorn's
``max_requests`` does. A result string with half a surrogate pair is sent with U+FFFD in its
place. The shards' largest result is ``SHARDCTL_MAX_RESULT_BYTES``. Standard library only.
"""

import json
import os
import queue
import sys
import threading
import time
import traceback
from collections import namedtuple

__all__ = ["serve", "Shard", "Aggregation", "Outcome", "Permanent", "RetryAfter", "FailTask", "PROTOCOL"]

PROTOCOL = 1

# the longest a RetryAfter defers a shard (the executor's bound too)
MAX_RETRY_AFTER_S = 24 * 3600

# the most of a traceback sent (its end: the frames nearest the error, and the message)
TRACEBACK_BYTES = 4096


class Permanent(Exception):
    """The shard fails for good now, whatever attempts are left: no attempt can mend it
    (malformed input)."""

    failure_class = "permanent"


class RetryAfter(Exception):
    """Not now: the next attempt not before ``seconds`` from now (an upstream answered 429). It
    uses no attempt and leaves the backoff as it was."""

    failure_class = "retry_after"

    def __init__(self, seconds, message=""):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
            raise ValueError("RetryAfter takes a finite number of seconds >= 0, not %r" % (seconds,))
        super().__init__(message or "retry after %gs" % seconds)
        self.seconds = seconds


class FailTask(Exception):
    """A fatal error of the whole task (a missing credential): the shard fails for good and the
    task fails at once, its other shards stopped."""

    failure_class = "fail_task"

_protocol_out = None


def _claim_stdout():
    """The protocol's stdout (the real fd 1, duplicated); fd 1 becomes stderr. Once."""
    global _protocol_out
    if _protocol_out is None:
        out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        # what was printed before and is still buffered goes to fd 1, now stderr
        sys.stdout.flush()
        _protocol_out = out
    return _protocol_out


if os.environ.get("SHARDCTL_WORKER_PROTOCOL"):
    _claim_stdout()

Outcome = namedtuple("Outcome", ["shard", "result", "error"])
Outcome.__doc__ = "One shard's outcome: its result, or (error not None) why it failed for good."


class Shard:
    """One shard: ``task_id``, ``kind``, ``index``, ``total``, ``start``, ``end`` (its items are
    ``range(start, end)``), ``key``, ``attempt`` (1 on the first), ``payload`` (the task's JSON
    payload, parsed; None when it has none)."""

    __slots__ = ("task_id", "kind", "index", "total", "start", "end", "key", "attempt", "payload", "_cancel")

    def __init__(self, msg, cancel):
        self.task_id = msg.get("task_id")
        self.kind = msg.get("kind")
        self.index = msg.get("index")
        self.total = msg.get("total")
        self.start = msg.get("start")
        self.end = msg.get("end")
        self.key = msg.get("key")
        self.attempt = msg.get("attempt")
        self.payload = msg.get("payload")
        self._cancel = cancel

    def cancelled(self):
        """True once the executor asked this shard to stop."""
        return self._cancel.is_set()

    def __repr__(self):
        return "Shard(task_id=%r, kind=%r, index=%r, start=%r, end=%r, attempt=%r)" % (
            self.task_id, self.kind, self.index, self.start, self.end, self.attempt)


class Aggregation:
    """One aggregation: ``task_id``, ``kind``, ``total``, ``done``, ``failed``, ``cancelled``, ``attempt``,
    ``payload``, and ``outcomes``, an iterator of ``Outcome(shard, result, error)`` in shard
    order. The library reads the outcome lines as they come (a cancel must get through), so
    they are buffered while the aggregator is slower than the pipe."""

    def __init__(self, msg, lines, cancel):
        self.task_id = msg.get("task_id")
        self.kind = msg.get("kind")
        self.total = msg.get("total")
        self.done = msg.get("done")
        self.failed = msg.get("failed")
        # k-of-n (--success-when): shards cancelled once the task met its goal; they have no
        # outcome
        self.cancelled = msg.get("cancelled", 0)
        self.attempt = msg.get("attempt")
        self.payload = msg.get("payload")
        self._lines = lines
        self._cancel = cancel
        self._ended = False

    def cancelled(self):
        """True once the executor asked this aggregation to stop."""
        return self._cancel.is_set()

    @property
    def outcomes(self):
        while not self._ended:
            m = self._lines.get()
            if m is None or m.get("type") == "end":
                self._ended = True
                return
            yield Outcome(m.get("shard"), m.get("result"), m.get("error"))

    def _drain(self):
        for _ in self.outcomes:
            pass


class _Channel:
    """The protocol's stdout, and the reader of its stdin (a thread of its own, so that a
    cancel arrives while a handler runs)."""

    def __init__(self, inp, out):
        self._out = out
        self._lock = threading.Lock()
        self.requests = queue.Queue()
        self._current = None  # (id, cancel event, follow-up queue or None)
        self._state = threading.Lock()
        self._running = None  # the id a handler runs, until its reply is written
        threading.Thread(target=self._read, args=(inp,), daemon=True).start()
        silence = os.environ.get("SHARDCTL_WORKER_SILENCE_MS", "")
        if silence.isdigit() and int(silence) > 0:
            every = max(int(silence) / 4000.0, 0.05)
            threading.Thread(target=self._alive, args=(every,), daemon=True).start()

    def _write(self, line):
        try:
            self._out.write(line)
        except UnicodeEncodeError:
            # half a surrogate pair (a string cut in two): U+FFFD in its place, as JSON.parse
            # and the executor read one
            self._out.write(line.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
        self._out.flush()

    def send(self, msg):
        # NaN and Infinity are not JSON: refused here (a ValueError), not sent
        line = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
        with self._lock:
            self._write(line)

    def running(self, rid):
        with self._lock:
            self._running = rid

    def reply(self, msg):
        """Sends the reply to the running request; no sign of life for it comes after."""
        line = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
        with self._lock:
            self._running = None
            self._write(line)

    def _alive(self, every):
        while True:
            time.sleep(every)
            with self._lock:
                if self._running is not None:
                    self._write('{"type":"alive","id":%s}\n' % json.dumps(self._running))

    def begin(self, rid, cancel, follow):
        with self._state:
            self._current = (rid, cancel, follow)

    def finish(self, rid):
        with self._state:
            # (the next request may have been registered already)
            if self._current is not None and self._current[0] == rid:
                self._current = None

    def _read(self, inp):
        for raw in inp:
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8", errors="replace")
            raw = raw.strip()
            if not raw:
                continue
            try:
                msg = json.loads(raw)
            except ValueError:
                sys.stderr.write("shardctl_worker: a line that is not JSON from the executor: %r\n" % raw[:200])
                continue
            kind = msg.get("type")
            if kind in ("shard", "aggregate"):
                cancel = threading.Event()
                follow = queue.Queue() if kind == "aggregate" else None
                # registered before the request is handed over: its follow-up lines and a
                # cancel may come before the main thread starts it
                self.begin(msg.get("id"), cancel, follow)
                self.requests.put((msg, cancel, follow))
            elif kind in ("outcome", "end"):
                with self._state:
                    cur = self._current
                if cur and cur[2] is not None and cur[0] == msg.get("id"):
                    cur[2].put(msg)
            elif kind == "cancel":
                with self._state:
                    cur = self._current
                if cur and cur[0] == msg.get("id"):
                    cur[1].set()
                    if cur[2] is not None:
                        cur[2].put(None)
        self.requests.put(None)


def _reason(e):
    text = str(e)
    return "%s: %s" % (type(e).__name__, text) if text else type(e).__name__


def _error_reply(rid, e, last):
    """The error reply for exception ``e``: its reason, its traceback (bounded), its class."""
    reply = dict(type="error", id=rid, error=_reason(e), **last)
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if len(tb) > TRACEBACK_BYTES:
        tb = "...\n" + tb[-TRACEBACK_BYTES:]
    reply["traceback"] = tb
    cls = getattr(e, "failure_class", None)
    seconds = getattr(e, "seconds", None)
    if cls == "retry_after" and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                 or not 0 <= seconds < float("inf")):
        cls = None  # an exception of its own that says retry_after without a delay: plain
    if cls in ("permanent", "retry_after", "fail_task"):
        reply["class"] = cls
        if cls == "retry_after":
            # the executor cuts a delay to 24 h: so is it here, before it can overflow
            reply["retry_after_ms"] = int(min(seconds, MAX_RETRY_AFTER_S) * 1000)
    return reply


def serve(handler, aggregator=None, stdin=None, stdout=None, max_requests=None):
    """Answers the executor's requests until it closes stdin, then returns.

    ``handler(shard)`` runs each shard (a :class:`Shard`); ``aggregator(aggregation)`` (an
    :class:`Aggregation`) each aggregation, if given. Each returns a JSON-able value; an
    exception fails the attempt with its type and message. With ``max_requests``, returns
    after answering that many requests, the last reply telling the executor so.
    """
    if max_requests is not None and (not isinstance(max_requests, int) or max_requests < 1):
        raise ValueError("max_requests must be a positive integer, not %r" % (max_requests,))
    if stdout is None:
        # the protocol keeps the real stdout; fd 1 becomes stderr, so that neither a print() in
        # a handler nor a subprocess it starts can write into the protocol
        out = _claim_stdout()
    else:
        out = stdout
    if stdin is None:
        # likewise the protocol keeps the real stdin (read as UTF-8 whatever the locale); fd 0
        # becomes /dev/null, so that a subprocess cannot read the executor's requests
        inp = os.fdopen(os.dup(0), "rb")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    else:
        inp = stdin
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        ch = _Channel(inp, out)
        ch.send({"type": "hello", "protocol": PROTOCOL})
        answered = 0
        while True:
            if max_requests is not None and answered >= max_requests:
                return
            item = ch.requests.get()
            if item is None:
                return
            msg, cancel, follow = item
            rid = msg.get("id")
            answered += 1
            last = {"retire": True} if max_requests is not None and answered >= max_requests else {}
            ch.running(rid)
            try:
                if msg["type"] == "shard":
                    result = handler(Shard(msg, cancel))
                else:
                    if aggregator is None:
                        raise RuntimeError("this worker has no aggregator")
                    agg = Aggregation(msg, follow, cancel)
                    try:
                        result = aggregator(agg)
                    finally:
                        agg._drain()
                if cancel.is_set():
                    reply = dict(type="error", id=rid, error="cancelled", **last)
                else:
                    reply = dict(type="result", id=rid, result=result, **last)
                try:
                    ch.reply(reply)
                except (TypeError, ValueError) as e:
                    ch.reply(dict(type="error", id=rid, error="the result is not JSON: %s" % e, **last))
            except Exception as e:  # a handler's failure fails the attempt, not the worker
                if cancel.is_set():
                    ch.reply(dict(type="error", id=rid, error="cancelled", **last))
                else:
                    ch.reply(_error_reply(rid, e, last))
            finally:
                ch.finish(rid)
    finally:
        sys.stdout = saved
