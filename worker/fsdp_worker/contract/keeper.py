"""What the operator and the keepers say to each other: FSDP_GANG, and the coordinator's wire.

`Gang` is the document the operator gives every keeper of an attempt (render/worker_container.py
writes it, keeper/gang.py reads it). What the operator (run/keepers.py) and the keepers say to a
gang's coordinator goes through `ask`: one JSON line asked, one JSON line answered, over TCP, on
the same connection. Torch-free (stdlib and pydantic): the operator imports this module.
"""

from __future__ import annotations

import enum
import json
import os
import socket
from typing import Annotated, Any

import pydantic
import pydantic.dataclasses

from fsdp_worker import contract
from fsdp_worker.contract import wire


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
        doc = wire.to_doc(self, drop_none={"spare", "listen"})  # set for spares and tests only
        return json.dumps(doc, separators=(",", ":"))

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


def ask(address: tuple[str, int], doc: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the coordinator; OSError or ValueError when it does not answer."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(json.dumps(doc).encode() + b"\n")
        with sock.makefile("rb") as fh:
            answer = json.loads(fh.readline(1 << 20))
    if not isinstance(answer, dict):
        raise ValueError(f"coordinator answered {answer!r}")
    return answer
