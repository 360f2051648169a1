"""`spec.checkpoint.objectStore` of an FSDPJob: checkpoints in an S3-API bucket instead of on a
ReadWriteMany claim, and the pod identity (`spec.serviceAccountName`) that may reach it.

Apart from api.py because where checkpoints live is a world of its own: bucket naming, endpoint
and credential rules, and what the worker pods are told (the checkpoint root becomes the URI
`s3://<bucket>/<prefix>`; endpoint, region and credentials reach the pod as the standard AWS
variables). The operator never reads the bucket nor the credentials Secret's data: a Secret is
named here and the kubelet resolves it (`secretKeyRef`). Callers read these models as
api.<Name>. No I/O, no clock, no kopf.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic
from pydantic import Field

from fsdp_operator.types.spec_rules import NAME_PATTERN, SpecModel, cel, rules

URI_SCHEME = "s3://"
# S3's bucket naming rules (general purpose buckets): 3-63 of [a-z0-9.-], a letter or digit at
# each end; the rest below (no "..", no IP address, reserved prefixes and suffixes).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_IP_LIKE = r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$"
# Object key prefix: segments of URL-safe characters, no empty, "." or ".." segment, no
# leading or trailing "/": keys under it then read the same in every client.
PREFIX_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
# http or https, a host name or IPv4 address, an optional port and path: no credentials in the
# URL, no query, no `$` (Kubernetes' variable expansion).
ENDPOINT_PATTERN = (
    r"^https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$"
)
REGION_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# The standard AWS variables every S3 client reads (boto3, s3torchconnector, obstore, s3fs).
ENV_ENDPOINT = "AWS_ENDPOINT_URL_S3"
ENV_REGION = "AWS_REGION"
ENV_DEFAULT_REGION = "AWS_DEFAULT_REGION"  # boto3 reads this one, not AWS_REGION
KEY_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
KEY_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"  # noqa: S105 (a key name)
KEY_SESSION_TOKEN = "AWS_SESSION_TOKEN"  # noqa: S105 (a key name; optional in the Secret)
SECRET_KEYS = (KEY_ACCESS_KEY_ID, KEY_SECRET_ACCESS_KEY, KEY_SESSION_TOKEN)

_BUCKET_RULES = (
    cel("!self.contains('..')", "bucket must not contain '..'"),
    cel(f"!self.matches(r'{_IP_LIKE}')", "bucket must not be formatted as an IP address"),
    cel(
        "!(" + " || ".join(f"self.startsWith('{p}')" for p in RESERVED_BUCKET_PREFIXES) + ")",
        f"bucket must not start with {', '.join(RESERVED_BUCKET_PREFIXES)} (reserved by S3)",
    ),
    cel(
        "!(" + " || ".join(f"self.endsWith('{s}')" for s in RESERVED_BUCKET_SUFFIXES) + ")",
        f"bucket must not end with {', '.join(RESERVED_BUCKET_SUFFIXES)} (reserved by S3)",
    ),
)


def bucket_refusal(bucket: str) -> str:
    """Why `bucket` breaks S3's naming rules beyond its pattern ("" when it keeps them): the
    CEL rules above, said again for specs the CRD never saw."""
    allowed = "3-63 of a-z 0-9 . -, a letter or digit at each end, no '..', not an IP address"
    if ".." in bucket or _is_ip(bucket):
        return f"checkpoint.objectStore.bucket={bucket!r} is not an S3 bucket name ({allowed})"
    if bucket.startswith(RESERVED_BUCKET_PREFIXES) or bucket.endswith(RESERVED_BUCKET_SUFFIXES):
        return (
            f"checkpoint.objectStore.bucket={bucket!r} uses a prefix or suffix S3 reserves"
            f" ({', '.join(RESERVED_BUCKET_PREFIXES + RESERVED_BUCKET_SUFFIXES)})"
        )
    return ""


def _is_ip(text: str) -> bool:
    return re.fullmatch(_IP_LIKE, text) is not None


class ObjectStore(SpecModel):
    """`spec.checkpoint.objectStore`: checkpoints in an S3-API bucket (AWS S3, or an
    S3-compatible store such as MinIO, Ceph RGW, versitygw or GCS's XML API). The worker pods
    read and write it with their own identity: the job's ServiceAccount (workload identity) or
    the keys of a Secret it names; the operator never reads the bucket or the Secret."""

    bucket: str = Field(
        min_length=3,
        max_length=63,
        pattern=BUCKET_PATTERN,
        description="Bucket name, as S3 names buckets: 3-63 of a-z, 0-9, '.' and '-', a "
        "letter or digit at each end, no '..', not an IP address.",
        json_schema_extra=rules(*_BUCKET_RULES),
    )
    prefix: str = Field(
        "",
        max_length=512,
        pattern=r"^$|" + PREFIX_PATTERN,
        description="Key prefix under which the job's checkpoints live (`<prefix>/<job>/step-N`)"
        ": '/'-separated segments of A-Z a-z 0-9 . _ -, no '.' or '..' segment, no leading or "
        "trailing '/'. Empty: the bucket's top. Immutable, as checkpoint.root is.",
    )
    endpoint: str | None = Field(
        None,
        max_length=2048,
        pattern=ENDPOINT_PATTERN,
        description="The S3 API's URL for a store other than AWS S3, e.g. "
        "https://storage.googleapis.com or http://minio.storage.svc:9000 (http or https, a "
        "host, an optional port and path; no credentials). The pods get it as "
        f"{ENV_ENDPOINT}. Unset: AWS S3 in the region.",
    )
    region: str | None = Field(
        None,
        max_length=64,
        pattern=REGION_PATTERN,
        description=f"Region the requests are signed for, e.g. us-east-1 ({ENV_REGION} and "
        f"{ENV_DEFAULT_REGION} in the pods). Unset: what the pods' own environment says "
        "(EKS sets it for workload identity).",
    )
    credentials_secret: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description=f"A Secret in the job's namespace holding {KEY_ACCESS_KEY_ID} and "
        f"{KEY_SECRET_ACCESS_KEY} (and optionally {KEY_SESSION_TOKEN}): the pods get them as "
        "those variables, resolved by the kubelet (the operator never reads them). Unset: the "
        "pods' own identity (spec.serviceAccountName with IRSA, EKS Pod Identity or GKE "
        "Workload Identity).",
    )

    @property
    def uri(self) -> str:
        """The checkpoint root as the worker reads it: `s3://<bucket>[/<prefix>]`."""
        return f"{URI_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    @pydantic.field_validator("bucket")
    @classmethod
    def _bucket(cls, bucket: str) -> str:
        if refused := bucket_refusal(bucket):
            raise ValueError(refused)
        return bucket

    def env(self) -> list[dict[str, Any]]:
        """What the worker container is told: the endpoint, the region and (from the named
        Secret, by the kubelet) the keys, as the standard AWS variables."""
        values = [
            (ENV_ENDPOINT, self.endpoint),
            (ENV_REGION, self.region),
            (ENV_DEFAULT_REGION, self.region),
        ]
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values if v]
        if self.credentials_secret is not None:
            env += [_secret_key(self.credentials_secret, key) for key in SECRET_KEYS]
        return env

    def env_names(self) -> list[str]:
        """The variables env() sets, which the template's env must leave to it."""
        return [str(var["name"]) for var in self.env()]


def _secret_key(secret: str, key: str) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if key == KEY_SESSION_TOKEN:
        ref["optional"] = True  # long-lived keys have none
    return {"name": key, "valueFrom": {"secretKeyRef": ref}}


SERVICE_ACCOUNT_DESCRIPTION = (
    "ServiceAccount (in the job's namespace) the worker pods run as: the job's own identity, "
    "for workload identity (IRSA's eks.amazonaws.com/role-arn annotation, EKS Pod Identity, "
    "GKE Workload Identity) to reach checkpoint.objectStore or other cloud services. Its "
    "token is mounted as the ServiceAccount's automountServiceAccountToken says. Unset: the "
    "namespace's default account, and no token is mounted (workers hold no credentials)."
)
