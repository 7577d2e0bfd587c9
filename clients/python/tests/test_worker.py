"""The Python worker library against the protocol, with a real interpreter: each test starts a
worker process (`python3 -c ...`) and speaks protocol 1 to it over pipes, as the executor does."""

import json
import os
import subprocess
import sys
import textwrap
import time
import unittest

LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(body, head="", **env_extra):
    env = dict(os.environ, PYTHONPATH=LIB, **env_extra)
    code = textwrap.dedent(head) + "from shardctl_worker import serve\n" + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True, encoding="utf-8", bufsize=1)


def send(p, msg):
    p.stdin.write(json.dumps(msg, ensure_ascii=False) + "\n")
    p.stdin.flush()


def read(p):
    line = p.stdout.readline()
    if not line:
        raise AssertionError("the worker closed stdout; stderr: " + p.stderr.read())
    return json.loads(line)


def shard(i, **kw):
    m = {"type": "shard", "id": i, "task_id": "t", "kind": "k", "index": i, "total": 10,
         "start": i * 10, "end": i * 10 + 10, "key": str(i), "attempt": 1, "payload": {"x": 1}}
    m.update(kw)
    return m


class WorkerTest(unittest.TestCase):
    def tearDown(self):
        for p in getattr(self, "procs", []):
            p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()

    def worker(self, body, head="", **env):
        p = start(body, head, **env)
        self.procs = getattr(self, "procs", []) + [p]
        self.assertEqual(read(p), {"type": "hello", "protocol": 1})
        return p

    def test_results_errors_and_the_shard_fields(self):
        p = self.worker("""
            def handle(s):
                if s.index == 2:
                    raise ValueError("no good")
                return [s.task_id, s.kind, s.index, s.total, s.start, s.end, s.key, s.attempt, s.payload]
            serve(handle)
        """)
        send(p, shard(1))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": ["t", "k", 1, 10, 10, 20, "1", 1, {"x": 1}]})
        send(p, shard(2))
        r = read(p)
        self.assertEqual({k: r[k] for k in ("type", "id", "error")}, {"type": "error", "id": 2, "error": "ValueError: no good"})
        # the traceback comes along: its last line is the message, a frame names the handler
        self.assertTrue(r["traceback"].startswith("Traceback (most recent call last):"), r["traceback"])
        self.assertEqual(r["traceback"].rstrip().splitlines()[-1], "ValueError: no good")
        self.assertIn("in handle", r["traceback"])
        self.assertNotIn("class", r)
        # the worker lives on after a failing shard
        send(p, shard(3))
        self.assertEqual(read(p)["result"][2], 3)

    def test_failures_carry_their_class(self):
        p = self.worker("""
            from shardctl_worker import Permanent, RetryAfter, FailTask
            def handle(s):
                if s.index == 1:
                    raise Permanent("malformed date in row %d" % s.start)
                if s.index == 2:
                    raise RetryAfter(1.5, "429 from the API")
                if s.index == 3:
                    raise FailTask("no API_TOKEN")
                if s.index == 4:
                    raise RetryAfter("soon")
                if s.index == 6:
                    raise RetryAfter(1e300, "much later")
                if s.index == 7:
                    raise RetryAfter(float("inf"))
                raise ZeroDivisionError("z" * 3000) from KeyError("k" * 3000)
            serve(handle)
        """)
        send(p, shard(1))
        r = read(p)
        self.assertEqual((r["class"], r["error"]), ("permanent", "Permanent: malformed date in row 10"))
        send(p, shard(2))
        r = read(p)
        self.assertEqual((r["class"], r["retry_after_ms"], r["error"]), ("retry_after", 1500, "RetryAfter: 429 from the API"))
        send(p, shard(3))
        self.assertEqual(read(p)["class"], "fail_task")
        # a RetryAfter without a number is the handler's own error: a plain failure that says so
        send(p, shard(4))
        r = read(p)
        self.assertNotIn("class", r)
        self.assertIn("RetryAfter takes a finite number of seconds", r["error"])
        # a huge delay is cut to 24 h; an infinite one is the handler's own error
        send(p, shard(6))
        self.assertEqual(read(p)["retry_after_ms"], 86400000)
        send(p, shard(7))
        r = read(p)
        self.assertNotIn("class", r)
        self.assertIn("finite number of seconds", r["error"])
        # a long traceback (two chained) is cut to its end, the message kept
        send(p, shard(5))
        r = read(p)
        self.assertLessEqual(len(r["traceback"]), 4096 + 4)
        self.assertTrue(r["traceback"].startswith("...\n"))
        self.assertTrue(r["traceback"].rstrip().endswith("ZeroDivisionError: " + "z" * 3000))

    def test_a_result_that_is_not_json_fails_the_shard_not_the_worker(self):
        p = self.worker("""
            serve(lambda s: object() if s.index == 1 else s.index)
        """)
        send(p, shard(1))
        r = read(p)
        self.assertEqual((r["type"], r["id"]), ("error", 1))
        self.assertIn("not JSON", r["error"])
        send(p, shard(2))
        self.assertEqual(read(p), {"type": "result", "id": 2, "result": 2})

    def test_print_and_subprocesses_write_to_stderr_not_the_protocol(self):
        p = self.worker("""
            import subprocess
            def handle(s):
                print("from print")
                subprocess.run(["echo", "from a child"])
                return "ok"
            serve(handle)
        """)
        send(p, shard(1))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": "ok"})
        p.stdin.close()
        p.wait(timeout=10)
        err = p.stderr.read()
        self.assertIn("from print", err)
        self.assertIn("from a child", err)

    def test_a_cancel_reaches_a_running_handler(self):
        p = self.worker("""
            import time
            def handle(s):
                deadline = time.time() + 20
                while not s.cancelled() and time.time() < deadline:
                    time.sleep(0.005)
                return "finished" if not s.cancelled() else "saw the cancel"
            serve(handle)
        """)
        send(p, shard(1))
        time.sleep(0.1)
        send(p, {"type": "cancel", "id": 1})
        # a cancelled shard's answer is an error: its result is not recorded
        self.assertEqual(read(p), {"type": "error", "id": 1, "error": "cancelled"})

    def test_an_aggregation_streams_its_outcomes(self):
        p = self.worker("""
            def agg(a):
                seen = []
                for o in a.outcomes:
                    seen.append(o.result if o.error is None else "failed: " + o.error)
                return {"task": a.task_id, "done": a.done, "failed": a.failed, "seen": seen}
            serve(lambda s: None, agg)
        """)
        send(p, {"type": "aggregate", "id": 5, "task_id": "t", "kind": "k", "total": 3, "done": 2, "failed": 1,
                 "attempt": 1, "payload": None})
        send(p, {"type": "outcome", "id": 5, "shard": 0, "result": 10})
        send(p, {"type": "outcome", "id": 5, "shard": 1, "error": "bad"})
        send(p, {"type": "outcome", "id": 5, "shard": 2, "result": 12})
        send(p, {"type": "end", "id": 5})
        self.assertEqual(read(p), {"type": "result", "id": 5,
                                   "result": {"task": "t", "done": 2, "failed": 1, "seen": [10, "failed: bad", 12]}})
        # and a shard after it
        send(p, shard(6))
        self.assertEqual(read(p), {"type": "result", "id": 6, "result": None})

    def test_an_aggregation_without_an_aggregator_fails(self):
        p = self.worker("serve(lambda s: 1)\n")
        send(p, {"type": "aggregate", "id": 1, "task_id": "t", "kind": "k", "total": 1, "done": 1, "failed": 0,
                 "attempt": 1, "payload": None})
        send(p, {"type": "outcome", "id": 1, "shard": 0, "result": 1})
        send(p, {"type": "end", "id": 1})
        r = read(p)
        self.assertEqual((r["type"], r["id"]), ("error", 1))
        self.assertIn("no aggregator", r["error"])

    def test_nan_is_not_json_and_fails_the_shard_not_the_worker(self):
        p = self.worker("serve(lambda s: float('nan') if s.index == 1 else s.index)\n")
        send(p, shard(1))
        r = read(p)
        self.assertEqual((r["type"], r["id"]), ("error", 1))
        self.assertIn("not JSON", r["error"])
        send(p, shard(2))
        self.assertEqual(read(p), {"type": "result", "id": 2, "result": 2})

    def test_a_subprocess_cannot_read_the_requests(self):
        p = self.worker("""
            import subprocess
            def handle(s):
                if s.index == 1:
                    # a child that reads its stdin gets /dev/null, not the next request
                    subprocess.Popen(["sh", "-c", "read line; echo stolen: $line >&2"])
                return s.index
            serve(handle)
        """)
        send(p, shard(1))
        self.assertEqual(read(p)["result"], 1)
        time.sleep(0.2)
        send(p, shard(2))
        self.assertEqual(read(p), {"type": "result", "id": 2, "result": 2})

    def test_text_is_utf8_whatever_the_locale(self):
        p = self.worker("serve(lambda s: s.payload)\n", PYTHONIOENCODING="latin-1", LC_ALL="C")
        send(p, shard(1, payload={"name": "café ✓"}))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": {"name": "café ✓"}})

    def test_the_end_of_stdin_ends_the_worker(self):
        p = self.worker("serve(lambda s: 1)\n")
        p.stdin.close()
        self.assertEqual(p.wait(timeout=10), 0)

    def test_a_print_before_serve_goes_to_stderr_under_an_executor(self):
        # a banner before the import (still buffered: a flushed one reaches the protocol, and
        # the executor passes it over), a model loading between it and serve() even unbuffered:
        # neither reaches the protocol, whose first line stays the hello
        p = self.worker("""
            import sys
            print("Loading model...", flush=True)
            serve(lambda s: s.index)
        """, head='print("banner at import")\n', SHARDCTL_WORKER_PROTOCOL="1", PYTHONUNBUFFERED="")
        send(p, shard(1))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": 1})
        p.stdin.close()
        self.assertEqual(p.wait(timeout=10), 0)
        err = p.stderr.read()
        self.assertIn("banner at import", err)
        self.assertIn("Loading model...", err)

    def test_half_a_surrogate_pair_is_sent_as_the_replacement_character(self):
        p = self.worker("""
            def handle(s):
                text = "report \U0001F4C8 up"
                # cut in the middle of the pair, as a UTF-16 slice would
                return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")[:8] + "\\ud83d"
            serve(handle)
        """)
        send(p, shard(1))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": "report \U0001F4C8\ufffd"})

    def test_max_requests_recycles_the_worker_and_its_last_reply_says_so(self):
        p = self.worker("serve(lambda s: s.index, max_requests=2)\n")
        send(p, shard(1))
        self.assertEqual(read(p), {"type": "result", "id": 1, "result": 1})
        send(p, shard(2))
        self.assertEqual(read(p), {"type": "result", "id": 2, "result": 2, "retire": True})
        self.assertEqual(p.wait(timeout=10), 0)

    def test_a_running_handler_sends_signs_of_life_and_none_after_its_reply(self):
        p = self.worker("""
            import time
            def handle(s):
                time.sleep(0.6)
                return s.index
            serve(handle)
        """, SHARDCTL_WORKER_SILENCE_MS="400")
        send(p, shard(1))
        lines = []
        while not lines or lines[-1]["type"] != "result":
            lines.append(read(p))
        self.assertGreaterEqual(len(lines), 3, lines)
        self.assertTrue(all(m == {"type": "alive", "id": 1} for m in lines[:-1]), lines)
        time.sleep(0.4)
        send(p, shard(2))
        # the next line answers request 2: no sign of life for request 1 came after its reply
        self.assertEqual(read(p)["id"], 2)


if __name__ == "__main__":
    unittest.main()
