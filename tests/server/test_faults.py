"""Faults against `klein serve`: each gets its documented status and OpenAI's error shape, and
the server keeps serving afterwards. Also the limits that keep one client from hurting others
(slow connections, event streams per job, kept results), a busy port, a job that throws, the
final event of every stream, and the request log. Standard library only: runs without PyPI."""
import json
import re
import socket
import subprocess
import threading
import time
import unittest

from serverlib import KLEIN, TINY, Server, job_events, multipart, raw_request, tiny_png


def post_raw(port, path, content_type, body):
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return raw_request(port, head, body)


class Faults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server("--max-body", "16")

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def tearDown(self):
        # After every fault: still alive, still generating.
        self.assertTrue(self.srv.alive(), "the server died")
        st, body, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "ok", "size": "32x32", "steps": 1})
        self.assertEqual(st, 200, body)

    def assertError(self, status, body, http, code=None, param=None):
        self.assertEqual(status, http, str(body)[:300])
        err = body["error"] if isinstance(body, dict) else json.loads(body[body.index("{"):])["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"})
        self.assertTrue(err["message"])
        if code:
            self.assertEqual(err["code"], code)
        if param:
            self.assertEqual(err["param"], param)

    def test_malformed_json(self):
        st, body, _ = self.srv.request("POST", "/v1/images/generations", b'{"prompt": "x", ',
                                       headers={"Content-Type": "application/json"})
        self.assertError(st, body, 400, "invalid_json")
        st, body, _ = self.srv.request("POST", "/v1/images/generations", b'["prompt"]',
                                       headers={"Content-Type": "application/json"})
        self.assertError(st, body, 400, "invalid_json")

    def test_malformed_multipart(self):
        body, ctype = multipart({"prompt": "x"}, [("image", "a.png", tiny_png())])
        st, text = post_raw(self.srv.port, "/v1/images/edits", ctype, body[:-40])  # cut before the closing boundary
        self.assertError(st, text, 400)
        st, text = post_raw(self.srv.port, "/v1/images/edits", "multipart/form-data; boundary=zzz", b"garbage\r\n")
        self.assertError(st, text, 400)

    def test_upload_over_the_limit_is_413(self):
        big = b"\0" * (50 << 20)
        body, ctype = multipart({"prompt": "x"}, [("image", "big.png", big)])
        st, text = post_raw(self.srv.port, "/v1/images/edits", ctype, body)
        self.assertError(st, text, 413, "request_too_large")

    def test_corrupt_image_part(self):
        png = tiny_png()
        body, ctype = multipart({"prompt": "x"}, [("image", "broken.png", png[:60])])
        st, b, _ = self.srv.request("POST", "/v1/images/edits", body, headers={"Content-Type": ctype})
        self.assertError(st, b, 400, "invalid_image", "image")
        self.assertIn("broken.png", b["error"]["message"])
        body, ctype = multipart({"prompt": "x"}, [("image", "noise.png", b"not an image at all")])
        st, b, _ = self.srv.request("POST", "/v1/images/edits", body, headers={"Content-Type": ctype})
        self.assertError(st, b, 400, "invalid_image", "image")

    def test_edit_without_image(self):
        body, ctype = multipart({"prompt": "x"}, [])
        st, b, _ = self.srv.request("POST", "/v1/images/edits", body, headers={"Content-Type": ctype})
        self.assertError(st, b, 400, "missing_required_parameter", "image")

    def test_unknown_field(self):
        st, b, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "x", "sedd": 3})
        self.assertError(st, b, 400, "unknown_parameter", "sedd")
        # OpenAI fields that change nothing here are accepted.
        st, b, _ = self.srv.request("POST", "/v1/images/generations",
                                    {"prompt": "x", "size": "32x32", "steps": 1, "model": "tiny", "quality": "high", "user": "u"})
        self.assertEqual(st, 200, b)

    def test_bad_values(self):
        for field, value in (("size", "65x64"), ("size", "64"), ("size", "0x64"), ("size", "99999x16"), ("n", 0),
                             ("n", 11), ("steps", -1), ("seed", -5), ("seed", "abc"), ("prompt", ""),
                             ("output_format", "gif")):
            body = {"prompt": "x", field: value}
            st, b, _ = self.srv.request("POST", "/v1/images/generations", body)
            self.assertError(st, b, 400, param=field)
        st, b, _ = self.srv.request("POST", "/v1/images/generations", {"size": "32x32"})
        self.assertError(st, b, 400, "missing_required_parameter", "prompt")

    def test_unknown_endpoint_and_job(self):
        st, b, _ = self.srv.request("GET", "/v1/nothing")
        self.assertError(st, b, 404)
        st, b, _ = self.srv.request("DELETE", "/v1/jobs/job_0")
        self.assertError(st, b, 404, "job_not_found")

    def test_bad_content_length_is_answered_at_once(self):
        # httplib would wait for these bodies until its 30 s read timeout: each must be refused
        # at once (the raw request gives up after 5 s) and the connection closed.
        for value, http, code in (("-1", 400, "malformed_request"), ("12345678901234567890123", 400, "malformed_request"),
                                  ("18446744073709551616", 400, "malformed_request"), ("12abc", 400, "malformed_request"),
                                  ("0x10", 400, "malformed_request"), ("+5", 400, "malformed_request"),
                                  ("9999999999999", 413, "request_too_large")):
            head = (f"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {value}\r\n\r\n").encode()
            t0 = time.time()
            st, text = raw_request(self.srv.port, head, timeout=5)
            self.assertError(st, text, http, code)
            self.assertLess(time.time() - t0, 5, value)
            self.assertIn("Connection: close", text, value)
        head = (b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10\r\nContent-Length: 12\r\n\r\n")
        st, text = raw_request(self.srv.port, head, timeout=5)
        self.assertError(st, text, 400, "malformed_request")
        head = (b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n")
        st, text = raw_request(self.srv.port, head, timeout=5)
        self.assertError(st, text, 400, "malformed_request")

    def test_streaming_fields_are_checked(self):
        for body, param, code in (({"stream": "yes"}, "stream", None), ({"stream": 1}, "stream", None),
                                  ({"stream": True, "partial_images": 4}, "partial_images", None),
                                  ({"stream": True, "partial_images": -1}, "partial_images", None),
                                  ({"partial_images": 2}, "partial_images", None),
                                  ({"input_fidelity": "high"}, "input_fidelity", "unsupported_value")):
            st, b, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "x", **body})
            self.assertError(st, b, 400, code, param)
        # The job interface has its own event stream.
        st, b, _ = self.srv.request("POST", "/v1/jobs", {"prompt": "x", "stream": True})
        self.assertError(st, b, 400, param="stream")
        body, ctype = multipart({"prompt": "x", "input_fidelity": "low"}, [("image", "a.png", tiny_png())])
        st, b, _ = self.srv.request("POST", "/v1/images/edits", body, headers={"Content-Type": ctype})
        self.assertError(st, b, 400, "unsupported_value", "input_fidelity")

    def test_slow_connections_do_not_starve_others(self):
        # Half a request each, then silence: every one holds a connection thread until the read
        # timeout. Others must still be served (more connections than the 64 threads kept).
        socks = []
        try:
            for _ in range(100):
                s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=10)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            time.sleep(0.5)  # every half request is in a thread's read by now
            t0 = time.time()
            st, b, _ = self.srv.request("GET", "/health", timeout=5)
            self.assertEqual(st, 200, b)
            self.assertLess(time.time() - t0, 5)
        finally:
            for s in socks:
                s.close()

    def test_event_streams_per_job_are_bounded(self):
        st, job, _ = self.srv.request("POST", "/v1/jobs", {"prompt": "long", "size": "512x512", "steps": 100})
        self.assertEqual(st, 202, job)
        head = f"GET /v1/jobs/{job['id']}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        streams = []
        try:
            for _ in range(8):  # --max-streams' default
                s = raw_request(self.srv.port, head, read=False)
                self.assertTrue(s.recv(4096).startswith(b"HTTP/1.1 200"))
                streams.append(s)
            st, text = raw_request(self.srv.port, head, timeout=5)
            self.assertError(st, text, 429, "too_many_streams")
        finally:
            self.srv.request("DELETE", "/v1/jobs/" + job["id"])
            for s in streams:
                s.close()

    def test_request_log(self):
        self.assertIsNotNone(self.srv.wait_log(r"klein serve: ready: model tiny \(.*tiny\) on http://127\.0\.0\.1:\d+/, "
                                               r"loaded in \d+\.\d+ s", timeout=0))
        start = len(self.srv.log())
        st, b, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "log me", "size": "32x48", "n": 2,
                                                                         "steps": 2})
        self.assertEqual(st, 200, b)
        self.assertIsNotNone(self.srv.wait_log(r"^klein serve: POST /v1/images/generations 200 job_[0-9a-f]+ size=32x48 "
                                               r"n=2 steps=2 \d+\.\d{3}s$", start=start), "".join(self.srv.log()[start:]))
        st, b, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "x", "size": "7x7"})
        self.assertIsNotNone(self.srv.wait_log(r"^klein serve: POST /v1/images/generations 400 \d+\.\d{3}s invalid_value$",
                                               start=start))
        # Successful health probes are left out unless -v.
        self.srv.request("GET", "/health")
        self.srv.request("GET", "/v1/models")
        self.assertIsNotNone(self.srv.wait_log(r"GET /v1/models 200", start=start))
        self.assertFalse([l for l in self.srv.log()[start:] if "GET /health" in l])
        # A path with a decoded newline stays on one line of the log.
        st, b, _ = self.srv.request("GET", "/v1/x%0Aklein%20serve:%20forged")
        self.assertEqual(st, 404)
        self.assertIsNotNone(self.srv.wait_log(r"^klein serve: GET /v1/x\?klein serve: forged 404", start=start))
        self.assertFalse([l for l in self.srv.log()[start:] if l.startswith("klein serve: forged")])

    def test_client_disconnect_cancels_its_job(self):
        before = self.srv.request("GET", "/health")[1]["jobs"]["cancelled"]
        # 100 steps at 1024x1024 take the tiny model many seconds: far longer than this test waits.
        body = json.dumps({"prompt": "long", "size": "1024x1024", "steps": 100}).encode()
        head = (f"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        s = raw_request(self.srv.port, head, body, read=False)
        deadline = time.time() + 10
        while self.srv.request("GET", "/health")[1]["status"] != "busy" and time.time() < deadline:
            time.sleep(0.02)
        s.close()
        t0 = time.time()
        st, b, _ = self.srv.request("POST", "/v1/images/generations", {"prompt": "next", "size": "32x32", "steps": 1})
        self.assertEqual(st, 200, b)
        self.assertLess(time.time() - t0, 5, "the abandoned job was not cancelled")
        self.assertEqual(self.srv.request("GET", "/health")[1]["jobs"]["cancelled"], before + 1)


def follow(url, job_id):
    return job_events(url, job_id)[1]


class OwnServer(unittest.TestCase):
    """Faults that need a server started with their own options."""

    def test_busy_port_is_an_error(self):
        srv = Server()
        try:
            p = subprocess.run([KLEIN, "serve", "--model", TINY, "--port", str(srv.port)], capture_output=True,
                               text=True, timeout=20)
            self.assertNotEqual(p.returncode, 0)
            self.assertNotIn("listening", p.stderr)
            self.assertEqual(p.stderr.strip().splitlines()[-1],
                             f"klein: serve: cannot listen on 127.0.0.1:{srv.port} (in use, or not an address of this machine)")
            st, _, _ = srv.request("GET", "/health")
            self.assertEqual(st, 200, "the first server still serves")
        finally:
            srv.close()

    def test_a_throwing_job_fails_alone(self):
        srv = Server("--test-throw-prompt", "boom")
        try:
            st, b, _ = srv.request("POST", "/v1/images/generations", {"prompt": "boom", "size": "32x32", "steps": 1})
            self.assertEqual((st, b["error"]["code"]), (500, "internal_error"), b)
            st, job, _ = srv.request("POST", "/v1/jobs", {"prompt": "boom", "size": "32x32", "steps": 1})
            self.assertEqual(follow(srv.url, job["id"])[-1][0], "error")
            # A streamed request ends with OpenAI's error event (which the openai client raises).
            body = json.dumps({"prompt": "boom", "size": "32x32", "steps": 1, "stream": True}).encode()
            st, text = raw_request(srv.port, (f"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                                              ).encode(), body)
            self.assertEqual(st, 200)
            self.assertIn("Content-Type: text/event-stream", text)
            m = re.search(r"event: error\r?\ndata: (.*)", text)
            self.assertIsNotNone(m, text)
            self.assertEqual(json.loads(m.group(1))["error"]["code"], "internal_error")
            st, b, _ = srv.request("POST", "/v1/images/generations", {"prompt": "fine", "size": "32x32", "steps": 1})
            self.assertEqual(st, 200, b)
            self.assertEqual(srv.request("GET", "/health")[1]["jobs"]["failed"], 3)
        finally:
            srv.close()

    def test_every_stream_ends_with_its_final_event(self):
        # Building the final event takes 600 ms here (as a large PNG's base64 does): a stream
        # must never see the job ended without that event.
        srv = Server("--test-finish-delay-ms", "600", "--test-throw-prompt", "boom")
        try:
            for _ in range(2):
                st, job, _ = srv.request("POST", "/v1/jobs", {"prompt": "x", "size": "32x32", "steps": 1})
                events = follow(srv.url, job["id"])
                self.assertEqual(events[-1][0], "done", [e[0] for e in events])
            st, job, _ = srv.request("POST", "/v1/jobs", {"prompt": "long", "size": "512x512", "steps": 100})
            deadline = time.time() + 10
            while srv.request("GET", "/v1/jobs/" + job["id"])[1]["status"] != "running" and time.time() < deadline:
                time.sleep(0.02)
            threading.Timer(0.3, lambda: srv.request("DELETE", "/v1/jobs/" + job["id"])).start()
            self.assertEqual(follow(srv.url, job["id"])[-1][0], "cancelled")
            st, job, _ = srv.request("POST", "/v1/jobs", {"prompt": "boom", "size": "32x32", "steps": 1})
            self.assertEqual(follow(srv.url, job["id"])[-1][0], "error")
        finally:
            srv.close()

    def test_kept_results_are_bounded_by_bytes(self):
        def run(srv, size):
            st, job, _ = srv.request("POST", "/v1/jobs", {"prompt": "x", "size": size, "steps": 1})
            self.assertEqual(follow(srv.url, job["id"])[-1][0], "done")
            return job["id"]

        def gone(job_id):
            # Results are dropped when the worker finishes a job, just after its stream ends.
            deadline = time.time() + 5
            while srv.request("GET", "/v1/jobs/" + job_id)[0] != 404:
                if time.time() > deadline:
                    return False
                time.sleep(0.02)
            return True

        srv = Server("--keep-results", "1")
        try:
            small = [run(srv, "32x32") for _ in range(3)]  # a few KiB each: all kept
            for j in small:
                self.assertEqual(srv.request("GET", "/v1/jobs/" + j)[0], 200)
            # 640² of the random-weight model's noise: a PNG of ~1.2 MB, over 1 MiB alone (the
            # assertion below checks it): the older ones go, the newest stays.
            big = run(srv, "640x640")
            st, b, _ = srv.request("GET", "/v1/jobs/" + big)
            self.assertEqual(st, 200)
            self.assertGreater(len(b["result"]["data"][0]["b64_json"]), 1 << 20)
            for j in small:
                self.assertTrue(gone(j), "an old result was kept past the byte budget")
            newer = run(srv, "32x32")
            self.assertTrue(gone(big), "the big result was not dropped")
            self.assertEqual(srv.request("GET", "/v1/jobs/" + newer)[0], 200)
        finally:
            srv.close()

    def test_verbose_log(self):
        srv = Server("-v")
        try:
            start = len(srv.log())
            srv.request("GET", "/health")
            self.assertIsNotNone(srv.wait_log(r"^klein serve: GET /health 200 \d+\.\d{3}s from 127\.0\.0\.1:\d+$",
                                              start=start))
            st, b, _ = srv.request("POST", "/v1/images/generations", {"prompt": "x", "size": "32x32", "steps": 1})
            self.assertIsNotNone(srv.wait_log(r"^klein serve: job job_[0-9a-f]+ succeeded after \d+\.\d{3} s", start=start))
        finally:
            srv.close()


class DuringLoad(unittest.TestCase):
    def test_requests_while_loading_get_503(self):
        srv = Server("--test-load-delay-ms", "1500", wait_ready=False)
        try:
            st, b, _ = srv.request("GET", "/health")
            self.assertEqual((st, b["status"]), (503, "loading"))
            st, b, h = srv.request("POST", "/v1/images/generations", {"prompt": "x", "size": "32x32"})
            self.assertEqual((st, b["error"]["code"]), (503, "model_loading"))
            self.assertGreaterEqual(int(h["Retry-After"]), 1)
            srv.wait_ready()
            st, b, _ = srv.request("POST", "/v1/images/generations", {"prompt": "x", "size": "32x32", "steps": 1})
            self.assertEqual(st, 200, b)
        finally:
            srv.close()

    def test_bad_model_exits_with_its_error(self):
        import subprocess
        from serverlib import KLEIN
        p = subprocess.run([KLEIN, "serve", "--model", "/nonexistent/model", "--port", "0"], capture_output=True,
                           text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/nonexistent/model", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
