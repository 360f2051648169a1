"""Certificates and kubeconfigs for the local control plane.

Generates one throwaway CA, the serving and client certificates the components need, and the
service-account signing key pair, with the ``openssl`` command line (argument lists only, never a
shell), so no Python crypto dependency is needed. Keys are EC P-256: fast to make, accepted by
etcd, the Kubernetes components and the service-account token signer.

This module only writes files under the directory it is given; it starts no processes.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import yaml

VALID_DAYS = 365
SERVICE_CLUSTER_IP = "10.96.0.1"
"""First address of the service range: the ``kubernetes`` Service's cluster IP."""

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = {usages}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
{san}
"""


@dataclasses.dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Leaf:
    """What a certificate to issue says about its holder."""

    name: str
    """File stem under the PKI directory."""
    common_name: str
    organization: str = ""
    """Kubernetes reads O= as the group of a client certificate."""
    server_names: tuple[str, ...] = ()
    """DNS names and IPs for a serving certificate; empty means client-only."""


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"openssl {args[0]} failed: {err.stderr.strip()}") from err


def _new_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    path.chmod(0o600)


def _config(tmp: Path, *, usages: str = "clientAuth", names: tuple[str, ...] = ()) -> Path:
    alts = ",".join(f"IP:{n}" if n[0].isdigit() else f"DNS:{n}" for n in names)
    san = f"subjectAltName = {alts}" if alts else ""
    path = tmp / "openssl.cnf"
    path.write_text(_OPENSSL_CONFIG.format(usages=usages, san=san))
    return path


def _subject(common_name: str, organization: str = "") -> str:
    return (f"/O={organization}" if organization else "") + f"/CN={common_name}"


def make_ca(directory: Path) -> Pair:
    """Create the cluster CA in ``directory`` (``ca.crt``, ``ca.key``)."""
    pair = Pair(directory / "ca.crt", directory / "ca.key")
    _new_key(pair.key)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp))
        _openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            str(pair.key),
            "-subj",
            "/CN=fsdp-operator-local-ca",
            "-days",
            str(VALID_DAYS * 10),
            "-config",
            str(cfg),
            "-extensions",
            "ca",
            "-out",
            str(pair.cert),
        )
    return pair


def issue(ca: Pair, directory: Path, leaf: Leaf) -> Pair:
    """Issue a certificate for ``leaf`` signed by ``ca``; serving ones are also client-capable."""
    pair = Pair(directory / f"{leaf.name}.crt", directory / f"{leaf.name}.key")
    _new_key(pair.key)
    usages = "serverAuth,clientAuth" if leaf.server_names else "clientAuth"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp), usages=usages, names=leaf.server_names)
        csr = Path(tmp) / "req.csr"
        subject = _subject(leaf.common_name, leaf.organization)
        _openssl(
            "req",
            "-new",
            "-key",
            str(pair.key),
            "-subj",
            subject,
            "-config",
            str(cfg),
            "-out",
            str(csr),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca.cert),
            "-CAkey",
            str(ca.key),
            "-set_serial",
            str(secrets.randbits(63)),
            "-days",
            str(VALID_DAYS),
            "-extfile",
            str(cfg),
            "-extensions",
            "leaf",
            "-out",
            str(pair.cert),
        )
    return pair


def make_signing_key(directory: Path) -> Pair:
    """Create the service-account token key pair; ``cert`` holds the public key."""
    pair = Pair(directory / "sa.pub", directory / "sa.key")
    _new_key(pair.key)
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
    return pair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path, *, server: str, ca: Path, user: dict[str, str], name: str = "local"
) -> Path:
    """Write a self-contained kubeconfig (all PEM data embedded), readable by its owner only.

    ``user`` is the kubeconfig ``user`` stanza, e.g. ``{"token": ...}`` or client cert data
    from :func:`client_user`.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(config, out, sort_keys=False)
    return path


def client_user(pair: Pair) -> dict[str, str]:
    """The kubeconfig ``user`` stanza for a client certificate."""
    return {"client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)}
