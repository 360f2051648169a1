"""Fixtures shared by the unit tests: a fake API server and the operator's client for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from fsdp_operator.io import kube
from tests import fakeapi


@pytest.fixture
def fake_api() -> Iterator[fakeapi.FakeAPI]:
    """A fake Kubernetes API server (tests/fakeapi.py); a request no test scripted fails it."""
    with fakeapi.serve() as api:
        yield api


@pytest.fixture
def api_client(fake_api: fakeapi.FakeAPI, tmp_path: Path) -> kubernetes.client.ApiClient:
    """The operator's own client (kube.load_client) pointed at `fake_api` by a kubeconfig."""
    return kube.load_client(config_file=str(fake_api.kubeconfig(tmp_path / "kubeconfig")))
