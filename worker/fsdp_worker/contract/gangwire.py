"""The keeper port's messages (version 1): typed requests and replies, signed per attempt.

Every request to a gang's keeper (29501: node rank 0's coordinator, the others on standby) is
one JSON object, one of the `Request` models below (which `op` decides), in an envelope that
names the job (its uid), the attempt, the time it was sent and a nonce, and carries `mac`: an
HMAC-SHA256 over the canonical JSON (sorted keys, no `mac`) under the attempt's key. Replies
carry the request's nonce and are signed with the same key, so a keeper that reached a stranger
(a reused pod IP) does not obey its answer. The attempt's key is `attempt_key(master, uid,
attempt)`: the operator keeps the master key, and gives each attempt's pods only their own key
(a Secret mounted into them), so a message signed for another job or another attempt fails.

What is refused, and why, is `Refusal`; keeper/guard.py applies these checks on the keeper's
side, contract/keeper.py's `ask` signs and verifies on the asker's. Pure: no socket, no file,
no clock read (the caller passes `now`). Torch-free: the operator imports it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import secrets
from typing import Annotated, Any, Literal

import pydantic


class Op(enum.StrEnum):
    """A request's `op`: what a keeper or the operator asks of a gang's coordinator, or tells
    a standby keeper. The values are the wire's: keepers of another release speak them too."""

    STATE = "state"
    """Anyone: the gang's generation, failures, nodes down and done, spares' places."""
    FAIL = "fail"
    """A keeper whose ranks failed first (`failure`, `final`: no restart in place after it);
    the operator's `final` alone when a takeover could not be completed."""
    DOWN = "down"
    """A keeper: its ranks of `generation` are stopped."""
    DONE = "done"
    """A keeper: its ranks of `generation` ended well (the exit barrier)."""
    REPLACE = "replace"
    """The operator: spare `spare` takes node `node`'s place (node lost or frozen)."""
    PROMOTE = "promote"
    """The operator, to a standby spare: node rank 0 is lost, become it and the coordinator."""
    FOLLOW = "follow"
    """The operator, to a standby keeper: the gang's coordinator and store are now elsewhere."""
    REJOIN = "rejoin"
    """A keeper told to follow: what node rank 0's coordinator last told it."""


VERSION = 1
"""The envelope's `v`. A keeper refuses any other: a later release says so in a new version."""
SKEW_SECONDS = 60.0
"""A request's `ts` may be this far from the keeper's clock (pods' clocks are NTP-synced); a
nonce is remembered twice as long, so a replay is refused for as long as its `ts` passes."""
MAX_LINE = 1 << 16
"""Bytes in one request line; a longer one is refused unread (a rejoin's failures fit)."""
KEY_BYTES = 32
"""A master or attempt key's length (HMAC-SHA256's block size is larger; 256 bits is plenty)."""


class Refusal(enum.StrEnum):
    """Why a keeper refused a request: the reply's `reason`, and a counter in its state."""

    MALFORMED = "malformed"  # not JSON, not an object, or a field of the wrong type or range
    OVERSIZED = "oversized"  # a line longer than MAX_LINE
    UNKNOWN_OP = "unknown-op"
    BAD_VERSION = "bad-version"
    BAD_MAC = "bad-mac"  # no mac, or not this attempt's key
    WRONG_JOB = "wrong-job"
    WRONG_ATTEMPT = "wrong-attempt"
    STALE_TS = "stale-ts"  # `ts` more than SKEW_SECONDS off
    REPLAY = "replay"  # a nonce seen within the window
    STALE_GENERATION = "stale-generation"  # a generation the gang is past, or not yet at
    OUT_OF_RANGE = "out-of-range"  # a node or spare the gang does not have
    BUSY = "busy"  # too many connections at once


class _Envelope(pydantic.BaseModel):
    """What every request carries besides its op's fields."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    v: Literal[1]
    job: Annotated[str, pydantic.Field(max_length=128)]
    attempt: Annotated[int, pydantic.Field(ge=0)]
    ts: float
    nonce: Annotated[str, pydantic.Field(min_length=16, max_length=64)]
    mac: Annotated[str, pydantic.Field(max_length=128)] = ""
    sender: int | None = pydantic.Field(default=None, alias="from")  # the asking keeper's node


Record = dict[str, Any]  # a failure record (contract.ranks' termination record, and notes)


class _Held(_Envelope):
    """A keeper's ask the coordinator may hold (long-poll, keeper/coordinator.py): `known`,
    the generation the keeper knows; without it the answer comes at once."""

    known: Annotated[int, pydantic.Field(ge=0)] | None = None


class StateAsk(_Held):
    op: Literal[Op.STATE]


class FailAsk(_Envelope):
    op: Literal[Op.FAIL]
    generation: int | None = None  # None: the operator's `final` alone
    failure: Record | None = None
    final: bool = False


class DownAsk(_Held):
    op: Literal[Op.DOWN]
    generation: Annotated[int, pydantic.Field(ge=0)]
    node: int


class DoneAsk(_Held):
    op: Literal[Op.DONE]
    generation: Annotated[int, pydantic.Field(ge=0)]
    node: int


class ReplaceAsk(_Envelope):
    op: Literal[Op.REPLACE]
    node: int
    spare: int
    failure: Record | None = None


class PromoteAsk(_Envelope):
    op: Literal[Op.PROMOTE]
    master: Annotated[str, pydantic.Field(max_length=300)]
    failure: Record | None = None
    generation: Annotated[int, pydantic.Field(ge=0)] = 0


class FollowAsk(_Envelope):
    op: Literal[Op.FOLLOW]
    coordinator: Annotated[str, pydantic.Field(max_length=300)]
    master: Annotated[str, pydantic.Field(max_length=300)]


class RejoinAsk(_Envelope):
    op: Literal[Op.REJOIN]
    node: int
    generation: Annotated[int, pydantic.Field(ge=0)]
    failures: list[Record] = []
    holders: dict[str, int] = {}


Request = Annotated[
    StateAsk | FailAsk | DownAsk | DoneAsk | ReplaceAsk | PromoteAsk | FollowAsk | RejoinAsk,
    pydantic.Field(discriminator="op"),
]
_REQUEST: pydantic.TypeAdapter[Request] = pydantic.TypeAdapter(Request)


class Reply(pydantic.BaseModel):
    """A keeper's answer as `ask` reads it: the envelope (the request's nonce echoed) and what
    the op says. Fields of the state are optional: `follow` answers `following` alone."""

    model_config = pydantic.ConfigDict(extra="allow", frozen=True)

    v: Literal[1]
    job: str
    attempt: int
    nonce: str
    mac: str = ""
    refused: str | None = None
    reason: Refusal | None = None
    generation: int | None = None
    final: bool | None = None


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Who a request speaks for: the job (uid) and attempt, and the attempt's key (None: an
    unsigned gang, as tests and a keeper started without a key file run)."""

    job: str
    attempt: int
    key: bytes | None = dataclasses.field(default=None, repr=False)


class Refused(ValueError):
    """A request or reply that fails a check: `reason` and what was wrong."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def attempt_key(master: bytes, job_uid: str, attempt: int) -> bytes:
    """The key of one attempt of one job, derived from the operator's master key: a pod that
    reads its own attempt's key learns nothing of another's."""
    return hmac.new(master, f"{job_uid}/{attempt}".encode(), hashlib.sha256).digest()


def new_master_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a mac is over: the object without `mac`, keys sorted, no spaces."""
    body = {k: v for k, v in doc.items() if k != "mac"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def mac(doc: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical(doc), hashlib.sha256).hexdigest()


def sign(doc: dict[str, Any], key: bytes | None) -> dict[str, Any]:
    """`doc` with its mac (unchanged but for `mac` where there is no key)."""
    return {**doc, "mac": mac(doc, key)} if key is not None else dict(doc)


def mac_ok(doc: dict[str, Any], key: bytes | None) -> bool:
    """Whether `doc` carries the mac of `key` (any doc, where there is no key)."""
    if key is None:
        return True
    given = doc.get("mac")
    return isinstance(given, str) and hmac.compare_digest(given, mac(doc, key))


def request(op: Op, fields: dict[str, Any], *, creds: Credentials, now: float) -> dict[str, Any]:
    """A signed request of `op` with `fields` (its op's fields, and `from`)."""
    doc = {
        **fields,
        "v": VERSION,
        "op": str(op),
        "job": creds.job,
        "attempt": creds.attempt,
        "ts": now,
        "nonce": secrets.token_hex(12),
    }
    return sign(doc, creds.key)


def decode(line: bytes) -> dict[str, Any]:
    """One line as a JSON object; Refused (oversized, malformed) when it is not."""
    if len(line) > MAX_LINE:
        raise Refused(Refusal.OVERSIZED, f"{len(line)} bytes, at most {MAX_LINE}")
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise Refused(Refusal.MALFORMED, f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise Refused(Refusal.MALFORMED, f"not a JSON object: {type(doc).__name__}")
    return doc


def parse_request(doc: dict[str, Any]) -> Request:
    """`doc` as its op's model, strictly (no "1" for 1, no true for 1); Refused naming the
    field otherwise. The version and the op are looked at first, for a clearer reason."""
    if doc.get("v") != VERSION:
        raise Refused(Refusal.BAD_VERSION, f"v={doc.get('v')!r}, this keeper speaks {VERSION}")
    if doc.get("op") not in set(Op):
        raise Refused(Refusal.UNKNOWN_OP, f"op={str(doc.get('op'))[:40]!r}")
    try:
        return _REQUEST.validate_json(json.dumps(doc), strict=True)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][1:]) or "?"
        raise Refused(Refusal.MALFORMED, f"{field}: {first['msg']}") from None


def check_envelope(doc: dict[str, Any], creds: Credentials, *, now: float) -> None:
    """The mac, the job, the attempt and the time of a request (or a reply: no `ts`);
    Refused on the first that fails."""
    if not mac_ok(doc, creds.key):
        raise Refused(Refusal.BAD_MAC, "no mac, or not this attempt's key")
    if doc.get("job") != creds.job:
        raise Refused(Refusal.WRONG_JOB, f"job {str(doc.get('job'))[:64]!r}")
    if doc.get("attempt") != creds.attempt:
        raise Refused(Refusal.WRONG_ATTEMPT, f"attempt {doc.get('attempt')!r}")
    ts = doc.get("ts", now)
    if not isinstance(ts, int | float) or abs(now - ts) > SKEW_SECONDS:
        raise Refused(Refusal.STALE_TS, f"ts {ts!r} is more than {SKEW_SECONDS:.0f}s off")


def reply(answer: dict[str, Any], *, creds: Credentials | None, nonce: str) -> dict[str, Any]:
    """`answer` in its envelope, signed (unsigned where the asker's credentials are not this
    keeper's: a refusal before the mac was checked is still signed, with this keeper's key)."""
    if creds is None:
        return {**answer, "v": VERSION}
    doc = {**answer, "v": VERSION, "job": creds.job, "attempt": creds.attempt, "nonce": nonce}
    return sign(doc, creds.key)


def read_reply(doc: dict[str, Any], *, creds: Credentials, nonce: str) -> Reply:
    """A reply `ask` obeys only if it is signed with this attempt's key and answers this
    request (its nonce); ValueError otherwise."""
    try:
        check_envelope(doc, creds, now=0.0)
    except Refused as exc:
        raise ValueError(f"an answer not from this gang ({exc}): {str(doc)[:200]}") from None
    if doc.get("nonce") != nonce:
        raise ValueError("an answer to another request (its nonce)")
    try:
        return Reply.model_validate(doc)
    except pydantic.ValidationError as exc:
        raise ValueError(f"a malformed answer: {exc.errors()[0]['msg']}") from None
