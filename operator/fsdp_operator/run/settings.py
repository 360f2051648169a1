"""Operator settings, read once from the environment at start-up.

Every knob is one field: its type, its default, its variable (the alias) and its docstring,
each written once; decide's knobs keep their defaults with the policies (restarts.Tunables).
A value that does not read stops the start with an error naming the variable, the value and
what is allowed. A plain pydantic model, not pydantic-settings: the images' hash-locked
requirements would need a new package for what twenty lines do here. Nothing here talks to the
cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Self

import pydantic
import pydantic.fields
import pydantic_core

from fsdp_operator.policy import restarts
from fsdp_worker.contract import wire

_TUNED = restarts.Tunables()
"""The defaults of decide's knobs, where decide's policies keep them."""


def _unset_if_empty(value: object) -> object:
    """An empty switch is an unset one (FSDPOP_DEEP_VERIFY="" was always off)."""
    if value == "":
        raise pydantic_core.PydanticUseDefault()
    return value


Switch = Annotated[bool, pydantic.BeforeValidator(_unset_if_empty)]
"""1/0, true/false, yes/no or on/off; anything else is an error naming the variable."""


def _label_pairs(value: object) -> object:
    """`k=v,k2=v2` (as a label selector spells it) to a dict; a dict passes as it is."""
    if not isinstance(value, str):
        return value
    pairs = [item.strip() for item in value.split(",") if item.strip()]
    if any(item.count("=") != 1 for item in pairs):
        raise ValueError(f"{value!r} is not k=v pairs separated by commas")
    return dict(item.split("=") for item in pairs)


Labels = Annotated[dict[str, str], pydantic.BeforeValidator(_label_pairs)]
"""`k=v,k2=v2`; empty: none."""


class _FromEnv(pydantic.BaseModel):
    """Read from the environment by each field's alias (its variable); built in code by field
    name. A field without an alias is not read from the environment."""

    model_config = pydantic.ConfigDict(
        frozen=True, populate_by_name=True, use_attribute_docstrings=True
    )

    @classmethod
    def read(cls, env: Mapping[str, str], **given: Any) -> Self:
        """The variables of `env` this model names, and `given` fields; ValueError names the
        variable, the value and what is allowed."""
        names = {name for field in cls.model_fields.values() for name in _variables(field)}
        doc = {k: v for k, v in env.items() if k in names}
        return wire.validate(cls, {**doc, **given}, what="operator environment", strict=False)


def _variables(field: pydantic.fields.FieldInfo) -> set[str]:
    chosen = field.validation_alias
    choices = chosen.choices if isinstance(chosen, pydantic.AliasChoices) else (chosen,)
    return {name for name in (field.alias, *choices) if isinstance(name, str)}


class _Tunables(_FromEnv):
    """restarts.Tunables' variables (its docstrings say what each does)."""

    node_exclusion_seconds: float = pydantic.Field(
        _TUNED.node_exclusion_seconds, alias="FSDPOP_NODE_EXCLUSION_SECONDS"
    )
    max_excluded_nodes: int = pydantic.Field(
        _TUNED.max_excluded_nodes, alias="FSDPOP_MAX_EXCLUDED_NODES"
    )
    drain_timeout_seconds: float = pydantic.Field(
        _TUNED.drain_timeout_seconds, alias="FSDPOP_DRAIN_TIMEOUT_SECONDS"
    )
    failure_grace_seconds: int = pydantic.Field(
        _TUNED.failure_grace_seconds, alias="FSDPOP_FAILURE_GRACE_SECONDS"
    )


class Settings(_FromEnv):
    storage_template: str = pydantic.Field("", alias="FSDPOP_STORAGE_TEMPLATE")
    """Where the operator sees a job's checkpoint volume: a path with {namespace} and {claim},
    e.g. /mnt/ckpt/{namespace}/{claim}. Empty: the operator cannot read checkpoints and lets
    workers pick (`auto`), so lineage is then the workers' job."""
    metrics_port: int = pydantic.Field(8000, alias="FSDPOP_METRICS_PORT")
    """Port of the operator's own Prometheus endpoint (0 disables it)."""
    metrics_cert_file: str = pydantic.Field("", alias="FSDPOP_METRICS_CERT_FILE")
    """With metrics_key_file: serve the metrics endpoint over TLS with this certificate (PEM)."""
    metrics_key_file: str = pydantic.Field("", alias="FSDPOP_METRICS_KEY_FILE")
    """The certificate's private key (PEM)."""
    metrics_client_ca_file: str = pydantic.Field("", alias="FSDPOP_METRICS_CLIENT_CA_FILE")
    """With TLS: accept only scrapers whose client certificate this CA signed (mutual TLS)."""
    liveness_endpoint: str = pydantic.Field("http://0.0.0.0:8080/healthz", alias="FSDPOP_LIVENESS")
    """kopf's liveness probe endpoint (empty: none)."""
    scrape_timeout_seconds: float = pydantic.Field(1.0, alias="FSDPOP_SCRAPE_TIMEOUT_SECONDS")
    """Timeout of one scrape of rank 0's metrics (hang detection, status.step)."""
    scrape_max_interval_seconds: float = pydantic.Field(
        60.0, alias="FSDPOP_SCRAPE_MAX_INTERVAL_SECONDS"
    )
    """A healthy job's rank 0 is scraped every min(progressDeadlineSeconds / 4, this)."""
    scrape_concurrency: int = pydantic.Field(32, alias="FSDPOP_SCRAPE_CONCURRENCY")
    """Scrapes in flight at once, across all jobs."""
    pass_workers: int = pydantic.Field(16, alias="FSDPOP_PASS_WORKERS")
    """Passes run at once (threads: a pass mostly waits on the API server)."""
    min_pause_seconds: float = pydantic.Field(0.2, alias="FSDPOP_MIN_PAUSE_SECONDS")
    """Least time between two passes of one job, however many events arrive."""
    error_backoff_initial_seconds: float = pydantic.Field(1.0, alias="FSDPOP_ERROR_BACKOFF_SECONDS")
    """After a failed pass the job's next pass waits this long, doubled for each failure in a
    row (watch events do not cut it short), and back to this after a pass succeeds."""
    error_backoff_max_seconds: float = pydantic.Field(
        300.0, alias="FSDPOP_ERROR_BACKOFF_MAX_SECONDS"
    )
    """The most a failing job's loop waits between passes."""
    leader_election: Switch = pydantic.Field(True, alias="FSDPOP_LEADER_ELECTION")
    """Act only while holding the Lease (several replicas: one leads, the others stand by)."""
    lease_name: str = pydantic.Field("fsdp-operator", alias="FSDPOP_LEASE_NAME")
    lease_namespace: str = pydantic.Field(
        "", validation_alias=pydantic.AliasChoices("FSDPOP_LEASE_NAMESPACE", "POD_NAMESPACE")
    )
    """Where the Lease lives; empty: the operator pod's own namespace (else `default`)."""
    watch_server_timeout: int = 60
    """Server-side watch timeout: a silently dead watch stream is re-opened this often."""
    watch_client_timeout: int = 90
    """Client-side watch timeout, a little above the server's."""
    node_lease_missed_renewals: int = pydantic.Field(2, alias="FSDPOP_NODE_LEASE_MISSED_RENEWALS")
    """A node whose Lease in `node_lease_namespace` missed this many renewals in a row (silent
    for this many renew periods and a quarter, by this process's clock, while other nodes
    renewed) is lost, before it turns NotReady (nodelease.py): 22.5 s on a kubelet's default
    40 s Lease. 0: only NotReady counts."""
    node_lease_namespace: str = pydantic.Field(
        "kube-node-lease", alias="FSDPOP_NODE_LEASE_NAMESPACE"
    )
    worker_module: str = pydantic.Field("fsdp_worker", alias="FSDPOP_WORKER_MODULE")
    """Python module torchrun runs in every pod. `fsdp_worker.train.standin` is the torch-free
    stand-in for dry runs and the operator's own tests."""
    deep_verify: Switch = pydantic.Field(False, alias="FSDPOP_DEEP_VERIFY")
    """Also compare sha256 of every checkpoint file (slow for big checkpoints)."""
    heap_report: str = pydantic.Field("", alias="FSDPOP_HEAP_REPORT")
    """SIGUSR2 writes a heap report to this path plus `.<n>` (heap.py); empty: none."""
    heap_frames: int = pydantic.Field(0, alias="FSDPOP_HEAP_FRAMES")
    """With heap_report: trace every allocation with this many frames (0: no tracing)."""
    network_policy: Switch = pydantic.Field(True, alias="FSDPOP_NETWORK_POLICY")
    """Give every job a NetworkPolicy (`<job>-gang`, render/netpol.py): only the job's own pods
    and the operator reach its gang's ports (rendezvous store, keepers); other ports as before."""
    operator_namespace: str = pydantic.Field("", alias="FSDPOP_OPERATOR_NAMESPACE")
    """The operator pods' namespace, which that policy lets in; empty: the operator is no pod
    (a host process: node traffic, which NetworkPolicies never block)."""
    operator_pod_labels: Labels = pydantic.Field(
        default_factory=dict, alias="FSDPOP_OPERATOR_POD_LABELS"
    )
    """With operator_namespace: the labels selecting the operator's pods there (`k=v,k2=v2`);
    empty: every pod of that namespace."""
    tunables: restarts.Tunables = pydantic.Field(default_factory=restarts.Tunables)
    """Node exclusion and draining knobs for decide() (their variables: _Tunables)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """From `env` (default: this process's environment); ValueError names the variable."""
        e = os.environ if env is None else env
        tuned = _Tunables.read(e)
        return cls.read(e, tunables=restarts.Tunables(**tuned.model_dump()))
