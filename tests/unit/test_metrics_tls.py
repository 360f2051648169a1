"""The operator's metrics endpoint over TLS and mutual TLS (the chart's `metrics.tls`).

Real certificates from the `openssl` CLI, a real HTTPS server (prometheus_client's), real
clients with and without a client certificate.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fsdp_operator.io import metrics
from fsdp_operator.run import settings


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(tmp: Path, name: str, *, ext: str) -> None:
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=tmp,
    )
    (tmp / f"{name}.ext").write_text(ext + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=tmp,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=test-ca",
        "-days",
        "1",
        cwd=tmp,
    )
    _issue(tmp, "server", ext="subjectAltName=IP:127.0.0.1")
    _issue(tmp, "scraper", ext="extendedKeyUsage=clientAuth")
    return tmp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return str(resp.read().decode())


def test_settings_read_the_tls_files_from_the_environment() -> None:
    conf = settings.Settings.from_env(
        {
            "FSDPOP_METRICS_CERT_FILE": "/tls/tls.crt",
            "FSDPOP_METRICS_KEY_FILE": "/tls/tls.key",
            "FSDPOP_METRICS_CLIENT_CA_FILE": "/tls/ca.crt",
        }
    )
    assert (conf.metrics_cert_file, conf.metrics_key_file, conf.metrics_client_ca_file) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        "/tls/ca.crt",
    )


def test_mutual_tls_serves_only_a_scraper_with_a_certificate_the_ca_signed(pki: Path) -> None:
    port = _port()
    metrics.serve(
        port,
        certfile=str(pki / "server.crt"),
        keyfile=str(pki / "server.key"),
        client_cafile=str(pki / "ca.crt"),
    )
    url = f"https://127.0.0.1:{port}/metrics"
    scraper = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    scraper.load_cert_chain(str(pki / "scraper.crt"), str(pki / "scraper.key"))
    assert "fsdpjob_jobs" in _get(url, scraper)

    anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _get(url, anonymous)  # no client certificate: the handshake is refused
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _get(f"http://127.0.0.1:{port}/metrics")  # plain HTTP gets nothing


def test_tls_without_client_auth_serves_any_https_client(pki: Path) -> None:
    port = _port()
    metrics.serve(port, certfile=str(pki / "server.crt"), keyfile=str(pki / "server.key"))
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    assert "fsdpjob_jobs" in _get(f"https://127.0.0.1:{port}/metrics", client)


@pytest.mark.parametrize(
    ("cert", "key", "ca", "words"),
    [
        ("/tls/tls.crt", "", "", "set both (TLS) or neither"),
        ("", "/tls/tls.key", "", "set both (TLS) or neither"),
        ("", "", "/tls/ca.crt", "FSDPOP_METRICS_CLIENT_CA_FILE needs"),
    ],
)
def test_half_a_tls_setting_is_refused_naming_the_variables(
    cert: str, key: str, ca: str, words: str
) -> None:
    with pytest.raises(ValueError, match="FSDPOP_METRICS_") as err:
        metrics.serve(_port(), certfile=cert, keyfile=key, client_cafile=ca)
    assert words in str(err.value)
