"""An HTTP proxy in front of the S3 test server that counts, delays, drops, fails and corrupts requests.

``FaultProxy(port)`` forwards every request to ``127.0.0.1:port`` unchanged
(headers too, so signed S3 requests still verify) and counts ranged GETs by
path (``gets``).  Faults apply to ranged GETs, each to the next ``n`` of them:
``fail(n, status)`` answers with that status (503 SlowDown by default),
``drop(n)`` closes the connection without an answer, ``flip(n)`` inverts one
byte of the body; ``delay`` seconds pass before each one is forwarded, and
while ``down`` is true every request's connection is closed (a server gone).
"""
from __future__ import annotations

import http.client
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"


class FaultProxy:
    def __init__(self, port: int) -> None:
        self.upstream, self.gets, self.lock = port, Counter(), threading.Lock()
        self.faults: list = []  # ("fail" | "drop" | "flip", status) applied to the next ranged GETs in turn
        self.delay, self.down, self.answered = 0.0, False, Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail(self, n: int, status: int = 503) -> None:
        self.faults += [("fail", status)] * n

    def drop(self, n: int) -> None:
        self.faults += [("drop", 0)] * n

    def flip(self, n: int) -> None:
        self.faults += [("flip", 0)] * n

    def data_gets(self, name: str) -> int:
        return sum(v for path, v in self.gets.items() if path.endswith("/" + name))

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if self.down:
            h.close_connection = True
            return
        fault = None
        if h.command == "GET" and "Range" in h.headers:
            with self.lock:
                self.gets[h.path.split("?")[0]] += 1
                fault = self.faults.pop(0) if self.faults else None
            if self.delay:
                threading.Event().wait(self.delay)
        if fault and fault[0] == "drop":
            h.close_connection = True
            return
        if fault and fault[0] == "fail":
            return self._answer(h, fault[1], {"Content-Type": "application/xml"}, SLOW_DOWN)
        status, headers, data = self._forward(h, body)
        if fault and fault[0] == "flip" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self._answer(h, status, headers, data)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes) -> tuple:
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        try:
            conn.request(h.command, h.path, body=body or None, headers=dict(h.headers.items()))
            r = conn.getresponse()
            data = r.read()
            drop = ("transfer-encoding", "connection") + (() if h.command == "HEAD" else ("content-length",))
            return r.status, {k: v for k, v in r.getheaders() if k.lower() not in drop}, data
        finally:
            conn.close()

    def _answer(self, h: BaseHTTPRequestHandler, status: int, headers: dict, data: bytes) -> None:
        self.answered[status] += 1
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
