"""A real S3-compatible server on 127.0.0.1 for the object-storage tests: s3s-fs (built by `make s3s-fs` into
~/.cache/eagle-io/), serving a temp directory whose subdirectories are its buckets, and a small fault-injecting
proxy in front of it (503 bursts). The tests skip, saying why, when the binary is absent."""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Where `make s3s-fs` installs it (the Makefile also exports the path as EAGLE_IO_S3S_FS).
BINARY = Path(
    os.environ.get("EAGLE_IO_S3S_FS", Path.home() / ".cache" / "eagle-io" / "s3s-fs-0.14.0" / "bin" / "s3s-fs")
)
ACCESS_KEY, SECRET_KEY = "eagle-io-test", "eagle-io-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"s3s-fs exited with status {proc.returncode} before listening on port {port} (see its log)"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class S3Server:
    """s3s-fs serving ``root`` (each subdirectory a bucket) with one access key, on a free loopback port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = open(root.parent / "s3s-fs.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [str(BINARY), "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS_KEY,
             "--secret-key", SECRET_KEY, str(root)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_listening(self.port, self.proc)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None, secret: str = SECRET_KEY) -> dict[str, str]:
        """The environment variables that point eagle-io (object_store) at this server."""
        return {
            "AWS_ENDPOINT": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def bucket(self, name: str) -> Path:
        """Creates bucket ``name`` (a directory of the served root) and returns its directory."""
        path = self.root / name
        path.mkdir()
        return path

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


class FaultProxy:
    """Forwards HTTP requests to ``port`` unchanged (so signatures still match), except that the next
    ``fail_next`` requests are answered 503 without being forwarded, and a request for which ``stall(method, path)``
    is true is never answered (``stalled`` is set; the request hangs until ``stop``). ``most_at_once`` is the
    largest number of requests it has forwarded concurrently."""

    def __init__(self, port: int) -> None:
        self.stall: Callable[[str, str], bool] | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.fail_next = 0
        self.failed = 0
        self.forwarded = 0
        self.at_once = self.most_at_once = 0
        lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.stall is not None and proxy.stall(self.command, self.path):
                    proxy.stalled.set()  # the client hangs here until it is killed (or the proxy stops)
                    proxy.release.wait(120)
                    return
                if proxy.fail_next > 0:
                    proxy.fail_next -= 1
                    proxy.failed += 1
                    msg = b"<Error><Code>SlowDown</Code><Message>injected 503</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                with lock:
                    proxy.forwarded += 1
                    proxy.at_once += 1
                    proxy.most_at_once = max(proxy.most_at_once, proxy.at_once)
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    with lock:
                        proxy.at_once -= 1
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                # A HEAD answer has no body: keep the object's length.
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def available() -> str | None:
    """None when the server binary is there, else why the object-storage tests skip."""
    if BINARY.is_file() or shutil.which(str(BINARY)):
        return None
    return f"s3s-fs is not built at {BINARY} (run `make s3s-fs`)"
