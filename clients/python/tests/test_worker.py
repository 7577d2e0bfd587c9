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


def start(body, **env_extra):
    env = dict(os.environ, PYTHONPATH=LIB, **env_extra)
    code = "from shardctl_worker import serve\n" + textwrap.dedent(body)
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

    def worker(self, body, **env):
        p = start(body, **env)
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
        self.assertEqual(read(p), {"type": "error", "id": 2, "error": "ValueError: no good"})
        # the worker lives on after a failing shard
        send(p, shard(3))
        self.assertEqual(read(p)["result"][2], 3)

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


if __name__ == "__main__":
    unittest.main()
