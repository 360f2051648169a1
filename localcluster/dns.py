"""Cluster DNS for the pod namespaces: A and PTR records from EndpointSlices, over UDP.

Serves ``<service>.<ns>.svc.cluster.local`` (the ready endpoint addresses: for headless
Services as CoreDNS does; for ClusterIP Services too, since there is no kube-proxy here to make
a virtual IP work) and ``<hostname>.<service>.<ns>.svc.cluster.local`` for endpoints that carry
a hostname (pods with spec.hostname and spec.subdomain). Listens on the bridge address only, so
the host's resolver is never involved. Packets are parsed and built with dnslib; only the
first question is answered, with A or PTR records (ANY gets them too): another type for a known
name gets an empty answer, an unknown name NXDOMAIN, an unparsable query FORMERR, and an answer
over 512 bytes is cut to fit with TC set. This module knows nothing about pods or processes.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Any

from dnslib import CLASS, PTR, QTYPE, RCODE, RR, A, DNSBuffer, DNSError, DNSHeader, DNSRecord

JSON = dict[str, Any]
log = logging.getLogger(__name__)
TYPE_A: int = QTYPE.A
TYPE_PTR: int = QTYPE.PTR
CLASS_IN: int = CLASS.IN
RCODE_NXDOMAIN: int = RCODE.NXDOMAIN
RCODE_FORMERR: int = RCODE.FORMERR
TTL_S = 5
UDP_LIMIT = 512
ZONE = "cluster.local"


class Records:
    """Names from EndpointSlices; thread-safe; rebuilt on every slice change."""

    def __init__(self) -> None:
        self._slices: dict[tuple[str, str], JSON] = {}
        self._a: dict[str, list[str]] = {}
        self._ptr: dict[str, str] = {}
        self._lock = threading.Lock()

    def update(self, kind: str, endpoint_slice: JSON) -> None:
        meta = endpoint_slice["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            if kind == "DELETED":
                self._slices.pop(key, None)
            else:
                self._slices[key] = endpoint_slice
            self._rebuild()

    def _rebuild(self) -> None:
        a: dict[str, list[str]] = {}
        ptr: dict[str, str] = {}
        for (namespace, _), item in self._slices.items():
            service = item["metadata"].get("labels", {}).get("kubernetes.io/service-name")
            if not service or item.get("addressType") != "IPv4":
                continue
            base = f"{service}.{namespace}.svc.{ZONE}"
            a.setdefault(base, [])
            for endpoint in item.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                addresses = list(endpoint.get("addresses", []))
                a[base].extend(addresses)
                if host := endpoint.get("hostname"):
                    a.setdefault(f"{host}.{base}", []).extend(addresses)
                    for address in addresses:
                        ptr[ipaddress.ip_address(address).reverse_pointer] = f"{host}.{base}"
        self._a, self._ptr = a, ptr

    def lookup_a(self, name: str) -> list[str] | None:
        with self._lock:
            return self._a.get(name)

    def lookup_ptr(self, name: str) -> str | None:
        with self._lock:
            return self._ptr.get(name)


def _formerr(packet: bytes) -> bytes:
    """A header-only FORMERR reply, for a packet whose header parses but whose question does not."""
    query = DNSHeader.parse(DNSBuffer(packet))
    header = DNSHeader(
        id=query.id, opcode=query.opcode, rd=query.rd, qr=1, aa=1, ra=1, rcode=RCODE_FORMERR
    )
    return bytes(DNSRecord(header).pack())


def answer(packet: bytes, records: Records) -> bytes:
    """The response to one query packet (names compared lowercased, without the final dot)."""
    try:
        query = DNSRecord.parse(packet)
        if not query.questions:
            raise DNSError("no question")
        question = query.q
        name = ".".join(label.decode("ascii") for label in question.qname.label).lower()
    except (DNSError, UnicodeDecodeError):
        return _formerr(packet)
    qtype, qclass = question.qtype, question.qclass
    reply = query.reply()  # id, first question; QR, AA and RA set
    # Keep only the query's opcode and RD; reply() would also copy TC, Z, AD, CD and rcode.
    reply.header.tc = reply.header.z = reply.header.ad = reply.header.cd = reply.header.rcode = 0
    addresses = records.lookup_a(name)
    target = records.lookup_ptr(name) if name.endswith(".arpa") else None
    if addresses is not None:
        if qtype in (TYPE_A, QTYPE.ANY) and qclass == CLASS_IN:
            for ip in addresses:
                reply.add_answer(RR(question.qname, TYPE_A, CLASS_IN, TTL_S, A(ip)))
    elif target is not None:
        if qtype in (TYPE_PTR, QTYPE.ANY):
            reply.add_answer(RR(question.qname, TYPE_PTR, CLASS_IN, TTL_S, PTR(target)))
    else:
        reply.header.rcode = RCODE_NXDOMAIN
    out = bytes(reply.pack())
    if len(out) > UDP_LIMIT:  # keep the answers that fit (all the same size) and set TC
        answers, reply.rr = reply.rr, []
        base = len(reply.pack())
        keep = (UDP_LIMIT - base) * len(answers) // (len(out) - base)
        reply.rr, reply.header.tc = answers[:keep], 1
        out = bytes(reply.pack())
    return out


class Server:
    """A UDP DNS server thread on ``address``:53."""

    def __init__(self, address: str, records: Records, *, port: int = 53) -> None:
        self.records = records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))
        self.sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self.sock.recvfrom(UDP_LIMIT * 8)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(packet) < 12:
                continue
            try:
                self.sock.sendto(answer(packet, self.records), peer)
            except Exception as exc:  # one odd packet must not stop cluster DNS
                log.debug("dns reply to %s failed: %s", peer, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
