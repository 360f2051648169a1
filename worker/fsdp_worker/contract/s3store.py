"""The fenced writer of a checkpoint root in an S3-API object store (`store.CheckpointStore`).

objstore.py has the layout, FENCE.json, the read view and the probe; this module changes the
root: takeover, seal, set aside and retention, each a compare-and-swap of FENCE.json on the
ETag held since the takeover, so a superseded writer fails at the store. Torch-free; it must
not choose checkpoints, and DCP writes the real worker's shards (`write_file` is for a writer
without DCP: the stand-in).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fsdp_worker.contract import catalog, fence
from fsdp_worker.contract.objstore import (
    FENCE_NAME,
    QUARANTINE_MARK,
    SCHEME,
    SHA256_META,
    FenceDoc,
    FenceView,
    client,
    list_objects,
    parse_root,
    probe,
    status_of,
    writer_name,
)

log = logging.getLogger(__name__)

_CAS_TRIES = 20
_READ_CHUNK = 8 * 1024 * 1024


def _conflict(exc: BaseException) -> bool:
    return status_of(exc) in (409, 412)


class S3Store:
    """A checkpoint root in an object store (`store.CheckpointStore`). Rank 0's fenced acts
    are CASes of FENCE.json on the ETag this object holds since its takeover."""

    def __init__(self, root: str, *, s3: Any | None = None) -> None:
        self.root = root.rstrip("/")
        self.loc = parse_root(self.root)
        self.s3 = s3 if s3 is not None else client()
        self._held: tuple[FenceDoc, str] | None = None  # the doc and its ETag, once taken over

    # reads

    def read_fence(self) -> tuple[FenceDoc, str | None]:
        """FENCE.json now and its ETag (an empty doc and None when absent)."""
        try:
            got = self.s3.get_object(Bucket=self.loc.bucket, Key=self.loc.key(FENCE_NAME))
        except Exception as exc:
            if status_of(exc) == 404:
                return FenceDoc(), None
            raise
        return FenceDoc.from_json(got["Body"].read()), str(got["ETag"])

    @property
    def storage(self) -> FenceView:
        """The sealed steps as they are now, for selection."""
        return FenceView(self.s3, self.loc, self.read_fence()[0])

    def locate(self, step_path: str) -> str:
        """The URI DCP reads for a sealed step's path (`<root>/step-<N>`)."""
        return f"{SCHEME}{self.loc.bucket}/{self.storage.key(step_path)}"

    def partial(self, me: fence.Writer, step: int) -> str:
        return self.loc.uri(catalog.step_dir_name(step), writer_name(me))

    def probe(self, me: fence.Writer) -> None:
        probe(self.s3, self.loc, me=me)

    # the fence

    def take_over(self, me: fence.Writer) -> None:
        """Hold the root for `me`: a CAS of FENCE.json naming `me`. Superseded when a newer
        writer of this job holds it; a lost race is retried against what is there then."""
        for _ in range(_CAS_TRIES):
            doc, etag = self.read_fence()
            if doc.writer is not None and doc.writer != me and me.superseded_by(doc.writer):
                raise fence.Superseded(self._message(me, doc.writer))
            if doc.writer == me and etag is not None:
                self._held = (doc, etag)
                return
            new = replace(doc, writer=me)
            if self._put_fence(new, etag):
                log.info("took %s over from %s", self.root, _who(doc.writer))
                return
        raise catalog.CatalogError(f"could not take {self.root} over as {me.describe()}")

    def _put_fence(self, doc: FenceDoc, etag: str | None) -> bool:
        """One conditional PUT of FENCE.json; False when another write came first."""
        cond = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            out = self.s3.put_object(
                Bucket=self.loc.bucket, Key=self.loc.key(FENCE_NAME), Body=doc.to_json(), **cond
            )
        except Exception as exc:
            if _conflict(exc) or status_of(exc) == 404:
                return False
            raise
        self._held = (doc, str(out["ETag"]))
        return True

    def _cas(self, me: fence.Writer, act: str, change: Callable[[FenceDoc], FenceDoc]) -> None:
        """Apply `change` to FENCE.json as `me` holds it. A 412 means another writer changed it:
        Superseded unless that was `me` (this process's other handle), then once more."""
        for _ in range(_CAS_TRIES):
            if self._held is None or self._held[0].writer != me:
                raise fence.Superseded(f"{me.describe()} does not hold {self.root} ({act} refused)")
            doc, etag = self._held
            if self._put_fence(change(doc), etag):
                return
            current, current_etag = self.read_fence()
            if current.writer != me or current_etag is None:
                raise fence.Superseded(self._message(me, current.writer, act))
            self._held = (current, current_etag)
        raise catalog.CatalogError(f"{act}: {self.root}'s {FENCE_NAME} kept changing")

    def _message(self, me: fence.Writer, by: fence.Writer | None, act: str = "") -> str:
        if by is None:
            return f"{me.describe()} no longer holds {self.root} ({act} refused)"
        return (
            f"{by.describe()} now writes {self.root}: {me.describe()} was superseded and "
            "publishes, quarantines and deletes nothing"
        )

    def newer_writer(self, me: fence.Writer) -> bool:
        holder = self.read_fence()[0].writer
        return holder is not None and holder != me and me.superseded_by(holder)

    def refusal(self, me: fence.Writer, act: str) -> fence.Superseded:
        return fence.Superseded(self._message(me, self.read_fence()[0].writer, act))

    # acts

    def publish(self, me: fence.Writer, *, marker: catalog.Marker) -> str:
        """The marker, create-only under `me`'s prefix, then the commit."""
        self.write_marker(me, marker=marker)
        self.commit(me, step=marker.step)
        return self.loc.uri(catalog.step_dir_name(marker.step))

    def write_marker(self, me: fence.Writer, *, marker: catalog.Marker) -> None:
        """Create-only: a save is marked once, and no writer replaces another's marker."""
        key = self.loc.key(catalog.step_dir_name(marker.step), writer_name(me), catalog.MARKER_NAME)
        try:
            self.s3.put_object(
                Bucket=self.loc.bucket, Key=key, Body=marker.to_json(), IfNoneMatch="*"
            )
        except Exception as exc:
            if _conflict(exc):
                raise catalog.CatalogError(f"{key} exists already: marked once") from exc
            raise

    def commit(self, me: fence.Writer, *, step: int) -> None:
        """The CAS that lists `step` as `me`'s save: the seal. An earlier save of the step
        listed before (past this attempt's resume point) is set aside by it."""
        name = writer_name(me)

        def seal(doc: FenceDoc) -> FenceDoc:
            before = doc.steps.get(step)
            set_aside = {**doc.quarantined}
            if before is not None and before != name:
                log.warning("step-%d already existed (%s); set it aside", step, before)
                set_aside[step] = [*set_aside.get(step, []), before]
            return replace(doc, steps={**doc.steps, step: name}, quarantined=set_aside)

        self._cas(me, f"publishing step {step}", seal)

    def set_aside(self, me: fence.Writer, *, step: int) -> str:
        """Quarantine: unlist the step (CAS) and leave a mark beside its objects."""
        held = self._held[0].steps.get(step) if self._held else None
        if held is None:
            raise catalog.CatalogError(f"step {step} is not sealed under {self.root}")

        def unlist(doc: FenceDoc) -> FenceDoc:
            steps = {k: v for k, v in doc.steps.items() if k != step}
            q = {**doc.quarantined, step: [*doc.quarantined.get(step, []), held]}
            return replace(doc, steps=steps, quarantined=q)

        self._cas(me, f"setting step {step} aside", unlist)
        mark = self.loc.key(catalog.step_dir_name(step), held, QUARANTINE_MARK)
        body = json.dumps({"by": me.describe(), "step": step}).encode()
        self.s3.put_object(Bucket=self.loc.bucket, Key=mark, Body=body)
        return self.loc.uri(catalog.step_dir_name(step), held)

    def delete(self, me: fence.Writer, *, path: str) -> None:
        """Retention: unlist the step (CAS; a superseded writer deletes nothing), then delete
        its objects."""
        step = int(posixpath.basename(path.rstrip("/")).removeprefix(catalog.STEP_PREFIX))
        held = self._held[0].steps.get(step) if self._held else None
        if held is None:
            return
        self._cas(
            me,
            f"deleting step {step}",
            lambda doc: replace(doc, steps={k: v for k, v in doc.steps.items() if k != step}),
        )
        self._delete_prefix(self.loc.key(catalog.step_dir_name(step), held))

    def clear_partial(self, me: fence.Writer, step: int) -> None:
        """`me`'s own unsealed leftovers of `step` (a save retried): never a listed save."""
        if self._held is not None and self._held[0].steps.get(step) == writer_name(me):
            return
        self._delete_prefix(self.loc.key(catalog.step_dir_name(step), writer_name(me)))

    def remove_abandoned(self, me: fence.Writer) -> None:
        """Earlier writers' saves that FENCE.json does not list (partial, or a paused zombie's):
        none can ever count now. Quarantined saves stay: they are evidence."""
        self.take_over(me)
        doc = self._held[0] if self._held else FenceDoc()
        keep = {(s, n) for s, n in doc.steps.items()}
        keep |= {(s, n) for s, names in doc.quarantined.items() for n in names}
        for step, name in self._saves():
            w = fence.parse("." + name)
            if (step, name) in keep or w is None or w == me or me.superseded_by(w):
                continue
            log.info("removing step-%d/%s, left by an earlier writer", step, name)
            self._delete_prefix(self.loc.key(catalog.step_dir_name(step), name))

    def _saves(self) -> list[tuple[int, str]]:
        """(step, writer prefix name) of every save present."""
        out = []
        for key in list_objects(self.s3, self.loc.bucket, self.loc.prefix):
            head, _, rest = key.partition("/")
            m = catalog.STEP_DIR_RE.match(head)
            if m and "/" in rest:
                out.append((int(m.group(1)), rest.partition("/")[0]))
        return sorted(set(out))

    def write_file(self, me: fence.Writer, step: int, name: str, data: bytes) -> None:
        """A small object of `me`'s save of `step` (a writer without DCP, such as the stand-in),
        its sha256 in the metadata the manifest reads."""
        key = self.loc.key(catalog.step_dir_name(step), writer_name(me), name)
        meta = {SHA256_META: hashlib.sha256(data).hexdigest()}
        self.s3.put_object(Bucket=self.loc.bucket, Key=key, Body=data, Metadata=meta)

    def manifest(self, me: fence.Writer, step: int, *, checksums: bool) -> dict[str, Any]:
        """The files of `me`'s save of `step`, with sizes (and sha256 from the writer's object
        metadata, or read, when `checksums`)."""
        prefix = self.loc.key(catalog.step_dir_name(step), writer_name(me))
        files = list_objects(self.s3, self.loc.bucket, prefix)
        files.pop(catalog.MARKER_NAME, None)
        return {
            name: catalog.FileEntry(
                size=size, sha256=self._sha256(f"{prefix}/{name}") if checksums else None
            )
            for name, size in sorted(files.items())
        }

    def _sha256(self, key: str) -> str:
        head = self.s3.head_object(Bucket=self.loc.bucket, Key=key)
        known = head.get("Metadata", {}).get(SHA256_META)
        if known:
            return str(known)
        digest = hashlib.sha256()
        body = self.s3.get_object(Bucket=self.loc.bucket, Key=key)["Body"]
        while chunk := body.read(_READ_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()

    def _delete_prefix(self, prefix: str) -> None:
        keys = [f"{prefix}/{name}" for name in list_objects(self.s3, self.loc.bucket, prefix)]
        for i in range(0, len(keys), 1000):
            objs = [{"Key": k} for k in keys[i : i + 1000]]
            self.s3.delete_objects(Bucket=self.loc.bucket, Delete={"Objects": objs, "Quiet": True})


def _who(writer: fence.Writer | None) -> str:
    return "nobody" if writer is None else writer.describe()
