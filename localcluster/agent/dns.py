"""Cluster DNS for the pod namespaces: A and PTR records from EndpointSlices, over UDP.

Serves ``<service>.<ns>.svc.cluster.local`` (the ready endpoint addresses: for headless
Services as CoreDNS does; for ClusterIP Services too, since there is no kube-proxy here to make
a virtual IP work) and ``<hostname>.<service>.<ns>.svc.cluster.local`` for endpoints that carry
a hostname (pods with spec.hostname and spec.subdomain). Listens on the bridge address only, so
the host's resolver is never involved. The wire format is the small subset a stub resolver
needs (RFC 1035 queries, one question, A/PTR answers); anything else gets an empty answer or
NXDOMAIN. This module knows nothing about pods or processes.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import threading
from typing import Any

JSON = dict[str, Any]
log = logging.getLogger(__name__)
TYPE_A, TYPE_PTR, CLASS_IN = 1, 12, 1
RCODE_NXDOMAIN, RCODE_FORMERR = 3, 1
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


def _encode_name(name: str) -> bytes:
    out = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p)
    return out + b"\0"


def _parse_question(packet: bytes) -> tuple[str, int, int, int]:
    """(name, qtype, qclass, end offset) of the first question."""
    labels, offset = [], 12
    while True:
        length = packet[offset]
        if length == 0:
            offset += 1
            break
        if length & 0xC0:
            raise ValueError("compressed question")
        labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    qtype, qclass = struct.unpack_from("!HH", packet, offset)
    return ".".join(labels), qtype, qclass, offset + 4


def answer(packet: bytes, records: Records) -> bytes:
    """The response to one query packet."""
    ident, flags = struct.unpack_from("!HH", packet)
    reply_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080  # QR, opcode, RD, AA, RA
    try:
        name, qtype, qclass, end = _parse_question(packet)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return struct.pack("!HHHHHH", ident, reply_flags | RCODE_FORMERR, 0, 0, 0, 0)
    question = packet[12:end]
    rdatas: list[tuple[int, bytes]] = []
    rcode = 0
    addresses = records.lookup_a(name)
    target = records.lookup_ptr(name) if name.endswith(".arpa") else None
    if addresses is not None:
        if qtype in (TYPE_A, 255) and qclass == CLASS_IN:
            rdatas = [(TYPE_A, socket.inet_aton(ip)) for ip in addresses]
    elif target is not None:
        if qtype in (TYPE_PTR, 255):
            rdatas = [(TYPE_PTR, _encode_name(target))]
    else:
        rcode = RCODE_NXDOMAIN
    body = b"".join(
        struct.pack("!HHHIH", 0xC00C, kind, CLASS_IN, TTL_S, len(rdata)) + rdata
        for kind, rdata in rdatas
    )
    if 12 + len(question) + len(body) > UDP_LIMIT:
        keep = (UDP_LIMIT - 12 - len(question)) // 16
        rdatas, reply_flags = rdatas[:keep], reply_flags | 0x0200  # TC
        body = b"".join(
            struct.pack("!HHHIH", 0xC00C, k, CLASS_IN, TTL_S, len(r)) + r for k, r in rdatas
        )
    header = struct.pack("!HHHHHH", ident, reply_flags | rcode, 1, len(rdatas), 0, 0)
    return header + question + body


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
