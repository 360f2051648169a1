"""The local cluster's S3 server, without starting it: requests signed as AWS documents
SigV4 (its own worked example), and the Service that names the host process in the cluster."""

from __future__ import annotations

import datetime
from pathlib import Path

from localcluster import objectstore

# "Example: GET Object" of AWS's SigV4 reference for S3 (sig-v4-header-based-auth).
AWS_EXAMPLE_KEYS = objectstore.Keys(
    access_key="AKIAIOSFODNN7EXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)
AWS_EXAMPLE_SIGNATURE = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_requests_are_signed_as_aws_documents() -> None:
    headers = objectstore.sign(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        keys=AWS_EXAMPLE_KEYS,
        body=b"",
        headers={"Range": "bytes=0-9"},
        region="us-east-1",
        now=datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC),
    )
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        f"Signature={AWS_EXAMPLE_SIGNATURE}"
    )


def test_pods_reach_the_host_process_by_a_cluster_name() -> None:
    service, endpoints = objectstore.service_objects(host="10.244.0.1", port=40123)
    assert "selector" not in service["spec"]  # nothing in the cluster to select: the host
    assert (
        endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == service["metadata"]["name"]
    )
    assert endpoints["endpoints"][0]["addresses"] == ["10.244.0.1"]
    assert endpoints["ports"][0]["port"] == 40123
    store = objectstore.ObjectStore(host="10.244.0.1", port=40123, keys=AWS_EXAMPLE_KEYS)
    assert store.cluster_endpoint == "http://s3.kube-system.svc.cluster.local"


def test_each_cluster_gets_its_own_keys_kept_off_the_command_line() -> None:
    one, two = objectstore.Keys.fresh(), objectstore.Keys.fresh()
    assert one != two
    argv = objectstore.server_args(
        binary=Path("/bin/versitygw"),
        host="10.244.0.1",
        port=1,
        data=Path("/d"),
    )
    assert one.secret_key not in " ".join(argv)
    assert set(one.server_env().values()) == {one.access_key, one.secret_key}
