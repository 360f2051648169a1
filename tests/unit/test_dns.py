"""Truth tables for the local cluster's DNS answers (localcluster.dns), no sockets."""

from __future__ import annotations

import socket
import struct

from localcluster import dns


def _query(name: str, qtype: int = dns.TYPE_A) -> bytes:
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)


def _records() -> dns.Records:
    records = dns.Records()
    records.update("ADDED", {
        "metadata": {"namespace": "ns", "name": "peers-abc",
                     "labels": {"kubernetes.io/service-name": "peers"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.1.2"], "hostname": "a", "conditions": {"ready": True}},
            {"addresses": ["10.244.2.2"], "hostname": "b", "conditions": {"ready": False}},
        ],
    })  # fmt: skip
    return records


def test_dns_answers_pod_and_service_names_with_ready_addresses() -> None:
    records = _records()
    reply = dns.answer(_query("a.peers.ns.svc.cluster.local"), records)
    ident, flags, _, answers, _, _ = struct.unpack_from("!HHHHHH", reply)
    assert (ident, flags & 0xF, answers) == (7, 0, 1)
    assert socket.inet_ntoa(reply[-4:]) == "10.244.1.2"
    service = dns.answer(_query("peers.ns.svc.cluster.local"), records)
    assert struct.unpack_from("!HHHHHH", service)[3] == 1, "not-ready endpoints are left out"


def test_dns_unknown_names_are_nxdomain_and_aaaa_is_empty() -> None:
    records = _records()
    missing = dns.answer(_query("nope.ns.svc.cluster.local"), records)
    assert struct.unpack_from("!HH", missing)[1] & 0xF == dns.RCODE_NXDOMAIN
    aaaa = dns.answer(_query("a.peers.ns.svc.cluster.local", qtype=28), records)
    _, flags, _, answers, _, _ = struct.unpack_from("!HHHHHH", aaaa)
    assert (flags & 0xF, answers) == (0, 0)
