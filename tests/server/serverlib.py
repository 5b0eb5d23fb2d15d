"""Starting and talking to `klein serve` in the server tests (standard library only)."""
import json
import os
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zlib

SKIP = 77  # ctest SKIP_RETURN_CODE


def require(*modules):
    """Exits 77 (a ctest skip), naming what is missing, when a module the suite needs is absent:
    the ServerVenv fixture could not install it (no PyPI)."""
    import importlib
    import sys
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"SKIP: {', '.join(missing)} not installed (the ServerVenv fixture could not reach PyPI); "
              f"python {sys.executable}", flush=True)
        sys.exit(SKIP)


KLEIN = os.environ["KLEIN_BIN"]
TINY = os.environ["KLEIN_TINY_MODEL"]
ARTIFACTS = os.environ.get("KLEIN_TEST_ARTIFACTS", ".")


class Server:
    """`klein serve --port 0` on loopback; the port is read from its first line on stderr. Its
    stderr is read to the end by a thread (the server logs every request: an unread pipe would
    fill and stall it); log() returns the lines so far."""

    def __init__(self, *args, wait_ready=True):
        self.proc = subprocess.Popen([KLEIN, "serve", "--model", TINY, "--port", "0", "--threads", "2", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self._lines, self._cv = [], threading.Condition()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self.port = None
        m = self.wait_log(r"listening on http://127\.0\.0\.1:(\d+)/", timeout=20)
        if m is None:
            raise RuntimeError("klein serve did not print its port:\n" + "".join(self.log()))
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            self.wait_ready()

    def _read_stderr(self):
        for line in self.proc.stderr:
            with self._cv:
                self._lines.append(line)
                self._cv.notify_all()
        with self._cv:
            self._lines.append(None)  # end of output
            self._cv.notify_all()

    def log(self):
        with self._cv:
            return [line for line in self._lines if line is not None]

    def wait_log(self, pattern, timeout=10, start=0):
        """The first match of `pattern` in a log line from line `start` on, waiting up to `timeout` s; None if none."""
        deadline = time.time() + timeout
        with self._cv:
            i = start
            while True:
                while i < len(self._lines):
                    if self._lines[i] is None:
                        return None
                    m = re.search(pattern, self._lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.time()
                if left <= 0:
                    return None
                self._cv.wait(left)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, body, _ = self.request("GET", "/health")
            if status == 200:
                return body
            time.sleep(0.05)
        raise RuntimeError("server not ready in time")

    def request(self, method, path, body=None, headers=None, timeout=60):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data is not None and not isinstance(body, bytes) else {}
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, _json(raw), dict(r.headers)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, _json(raw), dict(e.headers)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        self.proc.stderr.close()


def job_events(url, job_id, headers=None, timeout=60):
    """A /v1/jobs/{id}/events stream read to its end: (Content-Type, [(event name, data)])."""
    req = urllib.request.Request(f"{url}/v1/jobs/{job_id}/events", headers=headers or {})
    events, name = [], None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
        return r.headers["Content-Type"], events


def _json(raw):
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def multipart(fields, files):
    """(body, content type) of a multipart/form-data request: fields {name: text}, files [(name, filename, bytes)]."""
    boundary = "kleinTestBoundary7MA4YWxkTrZu0gW"
    out = b""
    for k, v in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    for name, filename, data in files:
        out += (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def png_text(png):
    """The iTXt/tEXt chunks of a PNG as a dict (what the CLI and server write as metadata)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, out = 8, {}
    while pos + 8 <= len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + n]
        if kind == b"iTXt":
            key, rest = data.split(b"\0", 1)
            comp, rest = rest[0], rest[2:]
            _lang, rest = rest.split(b"\0", 1)
            _tkey, text = rest.split(b"\0", 1)
            out[key.decode("latin-1")] = (zlib.decompress(text) if comp else text).decode("utf-8")
        elif kind == b"tEXt":
            key, text = data.split(b"\0", 1)
            out[key.decode("latin-1")] = text.decode("latin-1")
        pos += 12 + n
    return out


def png_size(png):
    return struct.unpack(">II", png[16:24])


def tiny_png(width=64, height=64, seed=1):
    """A small valid RGB PNG made here (a reference image for edits)."""
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 3 + seed) % 256) for x in range(width * 3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def raw_request(port, head, body=b"", read=True, timeout=30):
    """Sends a request on a raw socket (for what clients refuse to send); returns (status, text)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head)
        try:
            view = memoryview(body)
            for i in range(0, len(view), 1 << 20):
                s.sendall(view[i:i + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused the body early (413): its answer is still readable
        if not read:
            return s
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head_end = data.index(b"\r\n\r\n")
                    m = re.search(rb"Content-Length: (\d+)", data[:head_end], re.I)
                    if m and len(data) >= head_end + 4 + int(m.group(1)):
                        break
        except (ConnectionResetError, socket.timeout):
            pass
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
        return status, data.decode("latin-1")
    finally:
        if read:
            s.close()
