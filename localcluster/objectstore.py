"""The local cluster's object store: versitygw (an S3 API server over a directory, with the
conditional writes `If-None-Match: *` and `If-Match` that checkpoint commits rest on) as a host
process beside the control plane, and how the pods and the tests reach it.

It listens on the bridge's gateway, the host address every pod already reaches (the API server
and cluster DNS listen there too), and a Service without a selector plus an EndpointSlice give
it the cluster name ``s3.kube-system.svc.cluster.local`` (port 80): kube-proxy sends that
Service's traffic to the gateway, as it sends the ``kubernetes`` Service's. Its data is a
directory under the cluster's state dir; its root keys are made per cluster and handed to the
server in its environment (never on a command line another user can read).

Starting it costs about 30 ms and 32 MB (versitygw v1.8.0, this machine), so every cluster runs
one. ``request`` signs S3 requests (SigV4) with the standard library alone: the tests create
buckets with it, and its source runs unchanged inside a pod, whose image has no S3 client.

Stdlib only; apart from the objects it describes it knows nothing about Kubernetes.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SERVICE_NAME = "s3"
SERVICE_NAMESPACE = "kube-system"
SERVICE_PORT = 80
REGION = "us-east-1"  # versitygw's default; any name signs, as long as both sides agree
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""The keys of a credentials Secret, as spec.checkpoint.objectStore.credentialsSecret reads it."""


@dataclasses.dataclass(frozen=True)
class Keys:
    """Root credentials of one cluster's server."""

    access_key: str
    secret_key: str

    @classmethod
    def fresh(cls) -> Keys:
        return cls(access_key=f"LC{secrets.token_hex(9).upper()}", secret_key=secrets.token_hex(20))

    def server_env(self) -> dict[str, str]:
        """versitygw reads its root user from these, which keeps the keys off its argv."""
        return {"ROOT_ACCESS_KEY_ID": self.access_key, "ROOT_SECRET_ACCESS_KEY": self.secret_key}


@dataclasses.dataclass(frozen=True)
class ObjectStore:
    """Where one cluster's S3 server is, for the host (``endpoint``) and for pods
    (``cluster_endpoint``), and its root keys."""

    host: str
    port: int
    keys: Keys
    region: str = REGION

    @property
    def endpoint(self) -> str:
        """The URL on the host (the bridge's gateway, which the host owns)."""
        return f"http://{self.host}:{self.port}"

    @property
    def cluster_endpoint(self) -> str:
        """The URL pods use: the Service's DNS name."""
        return f"http://{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc.cluster.local"

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> Reply:
        """``method`` on ``path`` (``/bucket/key``, path style) from the host, signed."""
        return request(method, self.endpoint + path, keys=self.keys, body=body, headers=headers)

    def answers(self) -> bool:
        """Whether the server lists its buckets to its root user (up, and the keys right)."""
        try:
            return self.request("GET", "/").status == 200
        except OSError:
            return False

    def create_bucket(self, bucket: str) -> None:
        """Make ``bucket`` (an existing one of the root user's is fine)."""
        reply = self.request("PUT", f"/{bucket}")
        if reply.status != 200 and b"BucketAlreadyOwnedByYou" not in reply.body:
            raise OSError(f"CreateBucket {bucket}: HTTP {reply.status}: {reply.body[:300]!r}")

    def secret(self, name: str) -> dict[str, Any]:
        """A Secret (stringData) holding the root keys as a job's credentialsSecret wants."""
        values = (self.keys.access_key, self.keys.secret_key)
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "stringData": dict(zip(SECRET_KEYS, values, strict=True)),
        }


def server_args(*, binary: Path, host: str, port: int, data: Path) -> list[str]:
    """versitygw serving the directory ``data`` (its buckets are its directories)."""
    return [str(binary), "--port", f"{host}:{port}", "--quiet", "posix", str(data)]


def service_objects(*, host: str, port: int) -> list[dict[str, Any]]:
    """A Service without a selector and its one EndpointSlice: the server at ``host:port``."""
    labels = {"app.kubernetes.io/name": "versitygw", "app.kubernetes.io/managed-by": "localcluster"}
    meta = {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE, "labels": labels}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"ports": [{"name": "http", "port": SERVICE_PORT, "protocol": "TCP"}]},
    }
    slice_labels = {
        **labels,
        "kubernetes.io/service-name": SERVICE_NAME,
        "endpointslice.kubernetes.io/managed-by": "localcluster",
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {**meta, "name": f"{SERVICE_NAME}-host", "labels": slice_labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }
    return [service, endpoints]


# --- SigV4, standard library only (its source also runs in pods: keep it self-contained) ------


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]


def request(
    method: str,
    url: str,
    *,
    keys: Keys,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    region: str = REGION,
    timeout: float = 10.0,
) -> Reply:
    """An S3 request signed with AWS Signature Version 4; an HTTP error is a Reply too."""
    signed = sign(method, url, keys=keys, body=body, headers=headers or {}, region=region)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    req = urllib.request.Request(url, data=body or None, method=method, headers=signed)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (checked above)
            return Reply(int(resp.status), resp.read(), dict(resp.headers.items()))
    except urllib.error.HTTPError as err:
        return Reply(int(err.code), err.read(), dict(err.headers.items()))


def sign(
    method: str,
    url: str,
    *,
    keys: Keys,
    body: bytes,
    headers: dict[str, str],
    region: str,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """``headers`` plus the SigV4 ones (x-amz-date, x-amz-content-sha256, Authorization)."""
    parts = urllib.parse.urlsplit(url)
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    payload = hashlib.sha256(body).hexdigest()
    lower = {k.lower(): v.strip() for k, v in headers.items()}
    lower |= {"host": parts.netloc, "x-amz-date": stamp, "x-amz-content-sha256": payload}
    names = sorted(lower)
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(sorted(f"{_quote(k)}={_quote(v)}" for k, v in pairs))
    canonical = "\n".join(
        [
            method,
            urllib.parse.quote(parts.path or "/", safe="/-_.~"),
            query,
            "".join(f"{k}:{lower[k]}\n" for k in names),
            ";".join(names),
            payload,
        ]
    )
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}"
    key = ("AWS4" + keys.secret_key).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (
        f"AWS4-HMAC-SHA256 Credential={keys.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return {**{k: v for k, v in lower.items() if k != "host"}, "Authorization": auth}


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def source() -> str:
    """This module's text, to run in a pod (``exec`` it, then call ``request``)."""
    return Path(__file__).read_text()


def environ_keys() -> Keys | None:
    """Keys from the standard AWS variables (a pod's, from its credentials Secret)."""
    access, secret = (os.environ.get(k) for k in SECRET_KEYS)
    return Keys(access, secret) if access and secret else None
