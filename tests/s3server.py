"""A real S3 server for tests: versitygw serving a temporary directory.

`with S3Server(tmp_path) as s3:` starts versitygw (built into the cache by
localcluster/build-versitygw.sh) on a free loopback port, waits until it answers, creates one
bucket, and stops it on exit. Its attributes are what a pod gets from the operator:
`s3.endpoint`, `s3.access_key`, `s3.secret_key`, `s3.bucket`, `s3.region`; `s3.env()` is the
standard AWS environment naming them. versitygw honours `If-None-Match: *` and `If-Match` on
PutObject, as S3 does; `ForgetfulProxy` stands in front of it as a server that ignores both
(a stub proxy: it drops the headers and signs the request again), for the probe.
Shared by the worker and the operator tests; the product never imports it.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import pathlib
import socket
import socketserver
import subprocess
import threading
import urllib.parse
from typing import Any

from localcluster import poll

REPO = pathlib.Path(__file__).resolve().parent.parent
ACCESS_KEY = "fsdptestaccess"
SECRET_KEY = "fsdptestsecret0123456789"  # a test server's
REGION = "us-east-1"


def versitygw_binary() -> str:
    """The versitygw binary (built once, then cached; the script prints its path)."""
    out = subprocess.run(
        ["bash", str(REPO / "localcluster" / "build-versitygw.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """versitygw on a loopback port serving `<base>/s3data`, with one bucket `bucket`."""

    def __init__(self, base: str | os.PathLike[str], *, bucket: str = "ckpt") -> None:
        self.data = pathlib.Path(base) / "s3data"
        self.bucket, self.access_key, self.secret_key = bucket, ACCESS_KEY, SECRET_KEY
        self.region = REGION
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = pathlib.Path(base) / "versitygw.log"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS environment a worker reads (what the operator sets on a pod)."""
        return {
            "AWS_ENDPOINT_URL_S3": endpoint or self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def client(self, endpoint: str | None = None) -> Any:
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )

    def __enter__(self) -> S3Server:
        self.data.mkdir(parents=True, exist_ok=True)
        argv = [versitygw_binary(), "--access", self.access_key, "--secret", self.secret_key]
        argv += ["--port", f"127.0.0.1:{self.port}", "posix", str(self.data)]
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            poll.until(
                f"versitygw on {self.endpoint}",
                self._answers,
                timeout=30,
                every=0.1,
                diagnosis=lambda: self._log.read_text(errors="replace")[-2000:],
            )
            self.client().create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"versitygw exited: {self._log.read_text(errors='replace')}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
        ):
            return True
        return False

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_DROPPED = ("if-none-match", "if-match")


class _Forget(http.server.BaseHTTPRequestHandler):
    """Forwards every request to the real server with the conditional headers removed: the
    server a probe must refuse (as some S3-compatible stores behave). SigV4 signs only the
    headers it lists, and botocore does not list these, so the signature still holds."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)
    credentials: tuple[str, str] = ("", "")
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = self._resigned(body)
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _resigned(self, body: bytes) -> dict[str, str]:
        """The request's headers without the conditional ones, signed again (SigV4 signs every
        header botocore sends, these included)."""
        import botocore.auth
        import botocore.awsrequest
        import botocore.credentials

        host, port = self.upstream
        kept = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in (*_DROPPED, "authorization", "x-amz-date", "host")
        }
        url = f"http://{host}:{port}{self.path}"
        request = botocore.awsrequest.AWSRequest(self.command, url, data=body, headers=kept)
        creds = botocore.credentials.Credentials(*self.credentials)
        botocore.auth.S3SigV4Auth(creds, "s3", REGION).add_auth(request)
        return {**dict(request.headers.items()), "Host": f"{host}:{port}"}

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, *args: Any) -> None:
        """Quiet."""


class _ProxyServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class ForgetfulProxy:
    """`with ForgetfulProxy(s3) as endpoint:` an endpoint in front of `s3` that drops
    `If-None-Match` and `If-Match` from every request (and signs it again)."""

    def __init__(self, s3: S3Server) -> None:
        parsed = urllib.parse.urlparse(s3.endpoint)
        upstream = (parsed.hostname, parsed.port)
        credentials = (s3.access_key, s3.secret_key)
        handler = type("Handler", (_Forget,), {"upstream": upstream, "credentials": credentials})
        self._server = _ProxyServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
