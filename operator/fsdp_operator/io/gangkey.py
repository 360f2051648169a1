"""The operator's master gang key: a Secret in the operator's own namespace, got or created at
start-up.

Every attempt's key is derived from it (io/gang.py), so replicas and restarts of the operator
agree on them without storing one per attempt. Two replicas starting together may both find
none: the second's create is a 409, and it reads the first's. Only this module reads the
Secret (the chart's Role allows get on this one name, and create, in this namespace only).
"""

from __future__ import annotations

import base64
import logging

import kubernetes
from kubernetes.client.exceptions import ApiException

from fsdp_worker.contract import gangwire

log = logging.getLogger(__name__)

SECRET_NAME = "fsdp-operator-gang-key"  # noqa: S105 (a Secret's name, not a password)
DATA_KEY = "master"
READ_TIMEOUT = 30.0


def master_key(
    client: kubernetes.client.ApiClient, namespace: str, *, name: str = SECRET_NAME
) -> bytes:
    """The master key kept in Secret `namespace`/`name`, created (a new random key) when
    there is none. ApiException (403: the chart's Role is missing) when it cannot be had."""
    core = kubernetes.client.CoreV1Api(client)
    found = _read(core, namespace, name)
    if found is not None:
        return found
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {DATA_KEY: gangwire.new_master_key().hex()},
    }
    try:
        core.create_namespaced_secret(namespace, body, _request_timeout=READ_TIMEOUT)
        log.info("created the gang master key %s/%s", namespace, name)
    except ApiException as exc:
        if exc.status != 409:
            raise
    made = _read(core, namespace, name)  # a 409: another replica made it first
    if made is None:
        raise RuntimeError(f"the gang master key {namespace}/{name} vanished after its create")
    return made


def _read(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> bytes | None:
    """The key in the Secret; None when there is no Secret. ValueError: not a key."""
    try:
        secret = core.read_namespaced_secret(name, namespace, _request_timeout=READ_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    raw = (secret.data or {}).get(DATA_KEY, "")
    key = bytes.fromhex(base64.b64decode(raw).decode())
    if len(key) < gangwire.KEY_BYTES:
        raise ValueError(f"Secret {namespace}/{name}: {DATA_KEY} holds {len(key)} bytes")
    return key
