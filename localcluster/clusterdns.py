"""``python -m localcluster.clusterdns``: the local cluster's DNS server, as a process.

Lists and watches EndpointSlices through the API server and answers for
``<service>.<ns>.svc.cluster.local`` and ``<hostname>.<service>.<ns>.svc.cluster.local``
(``localcluster.dns``) on the cluster bridge's gateway, which every kubelet names as
``clusterDNS``. It plays CoreDNS's part for the names the tests and torchrun use; it forwards
nothing, so the host's resolver is never involved.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from localcluster import dns, kubeclient

SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
log = logging.getLogger("localcluster.clusterdns")


def watch_slices(client: kubeclient.Kube, records: dns.Records, stop: threading.Event) -> None:
    """List, then watch from that version; relist whenever the watch breaks."""
    while not stop.is_set():
        try:
            listing: dict[str, Any] = client.get(SLICES)
            for item in listing.get("items", []):
                records.update("ADDED", item)
            version = listing["metadata"]["resourceVersion"]
            while not stop.is_set():
                for event in client.watch(SLICES, resource_version=version):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise kubeclient.KubeError(obj.get("code", 500), obj.get("message", ""))
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        records.update(event["type"], obj)
        except Exception as exc:  # a broken watch must never end cluster DNS
            if not stop.is_set():
                log.info("watch restarts: %s", exc)
                time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.clusterdns")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--address", required=True, help="the IPv4 address to serve on, port 53")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    records = dns.Records()
    server = dns.Server(args.address, records)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    client = kubeclient.Kube(args.kubeconfig)
    threading.Thread(target=watch_slices, args=(client, records, stop), daemon=True).start()
    log.info("serving cluster DNS on %s:53", args.address)
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
