"""What the operator and the keepers say to each other: FSDP_GANG, and the coordinator's wire.

`Gang` is the document the operator gives every keeper of an attempt (render/worker_container.py
writes it, keeper/gang.py reads it). What the operator (run/keepers.py) and the keepers say to a
gang's coordinator goes through `ask`: one JSON line asked, one JSON line answered, over TCP, on
the same connection, both typed and signed with the attempt's key (gangwire.py). Torch-free
(stdlib and pydantic): the operator imports this module.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pydantic.dataclasses

from fsdp_worker import contract
from fsdp_worker.contract import gangwire, wire
from fsdp_worker.contract.gangwire import Op as Op  # the ops, where the keeper's code reads them

MAX_SPARE = 9_999
"""The highest spare number (the operator's pod names: `<job>-a<N>-s<number>`); numbers grow
as spares are used and replaced, so spec.spares is no bound."""
GANG_KEY_DIR = "/var/run/fsdp-gang"
"""Where the operator mounts an attempt's key (a Secret) into its pods, read-only."""
GANG_KEY_FILE = f"{GANG_KEY_DIR}/key"
"""The attempt's key, hex (FSDP_GANG's keyFile)."""


def host_port(text: str) -> tuple[str, int]:
    """`host:port` (a bracketed IPv6 host too) as a socket address; ValueError when it is not."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


@pydantic.dataclasses.dataclass(frozen=True, config=wire.CAMEL)
class Gang:
    """FSDP_GANG: what the operator tells every keeper of an attempt."""

    restarts: Annotated[int, pydantic.Field(ge=0)]  # in-place restarts allowed in this attempt
    coordinator: str  # host:port of node rank 0's keeper
    node: int  # this pod's node rank
    nodes: int  # pods in the gang
    non_retryable: tuple[int, ...] = ()  # worker exit codes never retried in place
    spare: int | None = None  # a warm spare's number (spec.spares): it waits, node -1, for a node
    listen: int | None = None  # the port this keeper answers on (default: the coordinator's)
    job: str | None = None  # the FSDPJob's uid: every message of the gang names it
    attempt: int | None = None  # the attempt: every message of the gang names it
    key_file: str | None = None  # the attempt's key (a Secret the operator mounts); None: unsigned

    @classmethod
    def from_env(cls, raw: str | None = None) -> Gang:
        """From the environment (or `raw`); ValueError names the field, the value and what is
        allowed."""
        raw = os.environ.get(contract.ENV_GANG, "") if raw is None else raw
        gang = wire.parse(cls, raw, what=contract.ENV_GANG)
        lowest = -1 if gang.spare is not None else 0  # a spare has no node yet
        if not lowest <= gang.node < gang.nodes:
            raise ValueError(
                f"{contract.ENV_GANG}: node={gang.node} must be {lowest} <= node < nodes "
                f"({gang.nodes})"
            )
        return gang

    def to_json(self) -> str:
        doc = wire.to_doc(self, drop_none=_LATER)  # set for spares and tests only
        return json.dumps(doc, separators=(",", ":"))

    def credentials(self) -> gangwire.Credentials:
        """What this gang's messages are signed with: the key file read now (ValueError when
        it cannot be read: the keeper then stops, a ConfigError, rather than speak unsigned)."""
        key = None
        if self.key_file is not None:
            try:
                key = bytes.fromhex(Path(self.key_file).read_text().strip())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{contract.ENV_GANG}: keyFile={self.key_file!r}: {exc}") from None
        return gangwire.Credentials(job=self.job or "", attempt=self.attempt or 0, key=key)

    @property
    def address(self) -> tuple[str, int]:
        return host_port(self.coordinator)

    @property
    def listen_port(self) -> int:
        """Every keeper answers on this port: node rank 0's as the gang's coordinator, the
        others on standby, for the operator's word when node rank 0 is lost (`promote` to a
        spare, `follow` to the others). Pods listen on the coordinator's port, each on its
        own address; keepers sharing one host (tests) are given their own."""
        return self.listen if self.listen is not None else self.address[1]


_LATER = frozenset({"spare", "listen", "job", "attempt", "keyFile"})
"""Fields left out of FSDP_GANG when unset: spares' and tests', and a later release's."""


class AnswerLate(TimeoutError):
    """`ask`'s keeper accepted the connection (its kernel did: the process is there) and gave
    no answer in time, or ended the connection without one (a coordinator at its connection
    cap does). Slow or frozen, not gone: a coordinator that cannot be reached at all (refused,
    no route, the connection timed out, the name does not resolve) raises the OSError itself.
    A TimeoutError, so that whoever catches OSError as "no answer" still does."""


def ask(
    address: tuple[str, int],
    doc: dict[str, Any],
    *,
    creds: gangwire.Credentials,
    timeout: float = 2.0,
) -> dict[str, Any]:
    """One request (`doc`: `op` and its fields) to a keeper, signed with `creds`; its answer,
    verified (signed by the same attempt's key, answering this request). OSError or ValueError
    when it does not answer, or not as this gang's keeper: AnswerLate (an OSError) where it
    accepted the connection and did not answer, any other OSError where it could not be
    reached."""
    fields = {k: v for k, v in doc.items() if k != "op"}
    signed = gangwire.request(Op(doc["op"]), fields, creds=creds, now=time.time())
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(json.dumps(signed).encode() + b"\n")
            with sock.makefile("rb") as fh:
                line = fh.readline(1 << 20)
        except OSError as exc:
            raise AnswerLate(f"{_where(address)} accepted, then: {exc}") from exc
    if not line:
        raise AnswerLate(f"{_where(address)} accepted, then closed without an answer")
    answer = json.loads(line)
    if not isinstance(answer, dict):
        raise ValueError(f"coordinator answered {answer!r}")
    gangwire.read_reply(answer, creds=creds, nonce=signed["nonce"])
    return {k: v for k, v in answer.items() if k not in _ENVELOPE}


def _where(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


_ENVELOPE = frozenset({"v", "job", "attempt", "nonce", "mac"})
