"""Faults against `klein serve`: each gets its documented status and OpenAI's error shape, and
the server keeps serving afterwards."""
import json
import socket
import time
import unittest

from serverlib import Server, multipart, raw_request, tiny_png


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
        self.assertEqual(status, http, body)
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
