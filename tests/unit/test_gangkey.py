"""The operator's master gang key (io/gangkey.py) against a fake API server: got when it is
there, created when not, and another replica's read when both create at once (a 409)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import kmock
import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import gangkey
from tests import fakeapi

NS = "fsdp-system"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SECRET = f"{SECRETS}/{gangkey.SECRET_NAME}"
THEIRS = bytes(range(32))


def secret(key: bytes) -> kmock.Response:
    data = {gangkey.DATA_KEY: base64.b64encode(key.hex().encode()).decode()}
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}, "data": data}
    return kmock.Response(status=200, payload=body)


def in_turn(*answers: Callable[[], kmock.Response]) -> Callable[[], kmock.Response]:
    """A reaction that gives `answers` one per request, in order."""
    left = list(answers)
    return lambda: left.pop(0)()


def test_a_master_key_that_is_there_is_read(
    fake_api: fakeapi.FakeAPI, api_client: kubernetes.client.ApiClient
) -> None:
    fake_api[f"get {SECRET}"] << secret(THEIRS)
    assert gangkey.master_key(api_client, NS) == THEIRS
    assert [r.method.value for r in fake_api.requests] == ["GET"]


def test_none_there_a_new_random_one_is_created_and_kept(
    fake_api: fakeapi.FakeAPI, api_client: kubernetes.client.ApiClient
) -> None:
    made: list[dict[str, Any]] = []

    def create(request: kmock.Request) -> kmock.Response:
        made.append(request.data)
        return kmock.Response(status=201, payload=request.data)

    fake_api[f"get {SECRET}"] << in_turn(
        lambda: fakeapi.status(404, "not found"),
        lambda: secret(bytes.fromhex(made[0]["stringData"][gangkey.DATA_KEY])),
    )
    fake_api[f"post {SECRETS}"] << create
    key = gangkey.master_key(api_client, NS)
    assert len(key) == 32 and made[0]["stringData"] == {gangkey.DATA_KEY: key.hex()}


def test_two_replicas_at_once_the_second_reads_the_firsts(
    fake_api: fakeapi.FakeAPI, api_client: kubernetes.client.ApiClient
) -> None:
    fake_api[f"get {SECRET}"] << in_turn(
        lambda: fakeapi.status(404, "not found"), lambda: secret(THEIRS)
    )
    fake_api[f"post {SECRETS}"] << fakeapi.status(409, "secrets already exists")
    assert gangkey.master_key(api_client, NS) == THEIRS


def test_without_the_charts_role_the_operator_does_not_start(
    fake_api: fakeapi.FakeAPI, api_client: kubernetes.client.ApiClient
) -> None:
    fake_api[f"get {SECRET}"] << fakeapi.status(403, "secrets is forbidden")
    with pytest.raises(ApiException) as raised:
        gangkey.master_key(api_client, NS)
    assert raised.value.status == 403
