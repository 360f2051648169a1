"""Checkpoints in an S3-API object store: the seal and the fence by conditional writes.

An object store has no rename, so nothing here moves. The root `s3://<bucket>/<prefix>` holds:

- ``<prefix>/step-<N>/<writer>/...``: the shards, DCP's ``.metadata`` and the marker of one
  writer's save of step N (``<writer>`` is `fence.Writer.dir_name` without its dot). Each
  writer saves under its own prefix: nothing it writes can land in another's checkpoint.
- ``<prefix>/FENCE.json``: the lineage object (`FenceDoc`): which writer holds the root, and
  for each sealed step whose save it is. It is changed only by compare-and-swap (PutObject with
  ``If-Match`` on the ETag this writer last wrote or read at its takeover; ``If-None-Match: *``
  when absent).

A save is sealed in two writes: the marker (create-only, ``If-None-Match: *``, under the
writer's own prefix), then the commit, a CAS of FENCE.json that lists the step as this
writer's. A step counts only when FENCE.json lists it, so a marker alone (a writer paused
before its CAS) is never chosen; and a writer whose root was taken over holds a stale ETag,
so its CAS fails at the store (412), wherever it was paused. Set aside and retention are
CASes too (set aside also leaves a small QUARANTINED.json mark; objects never move), and only
then does retention delete the objects. docs/contract.md, "Object-store commit protocol".

s3store.py is the writer (takeover, seal, set aside, retention). Readers see the store through
`FenceView`, a `catalog.Storage` that lists the sealed steps
only and maps ``<root>/step-<N>/<file>`` to the writer prefix FENCE.json names: selection's
rules (marker, manifest, config hash, lineage, deep verification) apply unchanged. Endpoint,
region and credentials come from the standard AWS environment (boto3's chain). Torch-free;
it must not choose checkpoints (selection.py) or write shards (the DCP writer does).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsdp_worker.contract import catalog, errors, fence

log = logging.getLogger(__name__)

SCHEME = "s3://"
FENCE_NAME = "FENCE.json"
QUARANTINE_MARK = "QUARANTINED.json"
PROBE_PREFIX = ".probe"
SHA256_META = "sha256"  # user metadata (x-amz-meta-sha256) a writer may attach to a shard
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_RE = re.compile(r"^([A-Za-z0-9._-]+/)*[A-Za-z0-9._-]+$")
_READ_CHUNK = 8 * 1024 * 1024


def is_uri(root: str) -> bool:
    return "://" in root


@dataclass(frozen=True)
class Location:
    """Where a root lives: a bucket and a key prefix (no leading or trailing slash)."""

    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        return posixpath.join(self.prefix, *parts) if self.prefix else posixpath.join(*parts)

    def uri(self, *parts: str) -> str:
        return f"{SCHEME}{self.bucket}/{self.key(*parts)}"


def parse_root(root: str, *, field_name: str = "checkpoint.root") -> Location:
    """`s3://<bucket>/<prefix>` as a Location; ValueError naming the field, the value and what
    is allowed for anything else (another scheme, a bad bucket name, `..`, an empty prefix)."""
    allowed = (
        "an absolute path on the claim, or s3://<bucket>/<prefix> (bucket: 3-63 of a-z 0-9 . -;"
        " prefix: one or more segments of A-Z a-z 0-9 . _ -, no '..')"
    )
    if not root.startswith(SCHEME):
        raise ValueError(f"{field_name}={root!r}: unsupported scheme; allowed: {allowed}")
    bucket, _, prefix = root[len(SCHEME) :].partition("/")
    prefix = prefix.rstrip("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ValueError(f"{field_name}={root!r}: bad bucket name {bucket!r}; allowed: {allowed}")
    if not _PREFIX_RE.match(prefix) or ".." in prefix.split("/") or "." in prefix.split("/"):
        raise ValueError(f"{field_name}={root!r}: bad key prefix {prefix!r}; allowed: {allowed}")
    return Location(bucket, prefix)


def client() -> Any:
    """A boto3 S3 client from the standard AWS environment (AWS_ENDPOINT_URL_S3 or
    AWS_ENDPOINT_URL, AWS_REGION, static keys or web identity), with path-style addressing
    where a custom endpoint is set (versitygw, MinIO and most on-premise stores need it)."""
    import boto3
    import botocore.config

    custom = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    cfg = botocore.config.Config(
        s3={"addressing_style": "path" if custom else "auto"},
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=32,
    )
    return boto3.session.Session().client("s3", config=cfg)


def status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(code) if code is not None else None


def _conflict(exc: BaseException) -> bool:
    """412 (precondition failed) or 409 (a concurrent conditional write won)."""
    return status_of(exc) in (409, 412)


# --- the lineage object ---------------------------------------------------------------------


@dataclass(frozen=True)
class FenceDoc:
    """FENCE.json: the writer that holds the root, and the save each sealed step is."""

    writer: fence.Writer | None = None
    steps: dict[int, str] = field(default_factory=dict)  # step -> writer prefix name
    quarantined: dict[int, list[str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        w = self.writer
        doc = {
            "format": 1,
            "writer": None
            if w is None
            else {"attempt": w.attempt, "generation": w.generation, "jobUid": w.job_uid},
            "steps": {str(k): v for k, v in sorted(self.steps.items())},
            "quarantined": {str(k): v for k, v in sorted(self.quarantined.items())},
        }
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FenceDoc:
        try:
            doc = json.loads(raw)
            w = doc["writer"]
            writer = None if w is None else fence.Writer(w["attempt"], w["generation"], w["jobUid"])
            steps = {int(k): str(v) for k, v in doc["steps"].items()}
            quarantined = {int(k): list(v) for k, v in doc.get("quarantined", {}).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise catalog.CatalogError(f"{FENCE_NAME} does not parse: {exc}") from exc
        return cls(writer, steps, quarantined)


def writer_name(me: fence.Writer) -> str:
    return me.dir_name.removeprefix(".")


# --- the read view for selection -------------------------------------------------------------


class FenceView:
    """`catalog.Storage` over one FENCE.json snapshot: `list_dirs(root)` names the sealed steps
    only, and ``<root>/step-<N>/<file>`` reads the object of the save FENCE.json names."""

    def __init__(self, s3: Any, loc: Location, doc: FenceDoc) -> None:
        self.s3, self.loc, self.doc = s3, loc, doc

    def key(self, path: str) -> str:
        """The object key of a path under the root (`<root>/step-<N>[/<file>]`)."""
        root = self.loc.uri()
        rel = path[len(root) :].strip("/") if path.startswith(root) else path.strip("/")
        head, _, rest = rel.partition("/")
        m = catalog.STEP_DIR_RE.match(head)
        if m is None or int(m.group(1)) not in self.doc.steps:
            raise catalog.CatalogError(f"{path} is not a sealed step of {root}")
        parts = [head, self.doc.steps[int(m.group(1))]] + ([rest] if rest else [])
        return self.loc.key(*parts)

    def list_dirs(self, root: str) -> list[str]:
        return sorted(catalog.step_dir_name(s) for s in self.doc.steps)

    def list_files(self, path: str) -> dict[str, int]:
        return list_objects(self.s3, self.loc.bucket, self.key(path))

    def read_bytes(self, path: str) -> bytes:
        body = self.s3.get_object(Bucket=self.loc.bucket, Key=self.key(path))["Body"]
        return bytes(body.read())

    def exists(self, path: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.loc.bucket, Key=self.key(path))
        except Exception as exc:
            if status_of(exc) == 404:
                return False
            raise
        return True

    def sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        body = self.s3.get_object(Bucket=self.loc.bucket, Key=self.key(path))["Body"]
        while chunk := body.read(_READ_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()

    def rename(self, src: str, dst: str) -> None:
        raise catalog.CatalogError("an object store has no rename: set aside through the fence")


def list_objects(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Every object under `prefix/` with its size, by name relative to it."""
    out: dict[str, int] = {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    for page in pages:
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = int(obj["Size"])
    return out


# --- the probe --------------------------------------------------------------------------------


def probe(s3: Any, loc: Location, *, me: fence.Writer) -> None:
    """Refuse a store that ignores conditional writes (ConfigError): the second create-only
    PUT of one key, and a PUT with a wrong ETag, must both be refused (412). Without that the
    marker could be overwritten and a fenced writer's commit would succeed: no fence holds."""
    key = loc.key(PROBE_PREFIX, f"{writer_name(me)}-{uuid.uuid4().hex}")
    ignored = []
    try:
        s3.put_object(Bucket=loc.bucket, Key=key, Body=b"1", IfNoneMatch="*")
        if _accepted(lambda: s3.put_object(Bucket=loc.bucket, Key=key, Body=b"2", IfNoneMatch="*")):
            ignored.append("If-None-Match: * (a second create-only PUT succeeded)")
        wrong = '"00000000000000000000000000000000"'
        if _accepted(lambda: s3.put_object(Bucket=loc.bucket, Key=key, Body=b"3", IfMatch=wrong)):
            ignored.append("If-Match (a PUT with a wrong ETag succeeded)")
    finally:
        s3.delete_object(Bucket=loc.bucket, Key=key)
    if ignored:
        raise errors.ConfigError(
            f"checkpoint.root={loc.uri()}: the S3 server ignores conditional writes "
            f"({'; '.join(ignored)}), so the checkpoint fence cannot hold and a superseded "
            "writer could overwrite or commit checkpoints. Use a store that honours them "
            "(AWS S3, versitygw >= 1.8, MinIO >= 2024-11), or a checkpoint claim."
        )


def _accepted(put: Callable[[], Any]) -> bool:
    try:
        put()
    except Exception as exc:
        if _conflict(exc):
            return False
        raise
    return True
