"""The operator's settings from its environment: the defaults an unset variable leaves, each
variable read with its type, and a value that does not read stopping the start with the
variable named."""

from __future__ import annotations

import pytest

from fsdp_operator.policy import restarts
from fsdp_operator.run import settings


def test_an_empty_environment_leaves_the_documented_defaults() -> None:
    conf = settings.Settings.from_env({})
    assert conf == settings.Settings()
    assert (conf.metrics_port, conf.liveness_endpoint) == (8000, "http://0.0.0.0:8080/healthz")
    assert (conf.scrape_timeout_seconds, conf.scrape_max_interval_seconds) == (1.0, 60.0)
    assert (conf.scrape_concurrency, conf.pass_workers, conf.min_pause_seconds) == (32, 16, 0.2)
    assert (conf.error_backoff_initial_seconds, conf.error_backoff_max_seconds) == (1.0, 300.0)
    assert (conf.leader_election, conf.lease_name, conf.lease_namespace) == (
        True,
        "fsdp-operator",
        "",
    )
    assert (conf.node_lease_missed_renewals, conf.node_lease_namespace) == (2, "kube-node-lease")
    assert (conf.worker_module, conf.deep_verify, conf.storage_template) == (
        "fsdp_worker",
        False,
        "",
    )
    assert (conf.heap_report, conf.heap_frames) == ("", 0)
    assert conf.tunables == restarts.Tunables(
        node_exclusion_seconds=300.0,
        max_excluded_nodes=8,
        drain_timeout_seconds=120.0,
        failure_grace_seconds=5,
    )


def test_each_variable_is_read_with_its_type() -> None:
    conf = settings.Settings.from_env(
        {
            "FSDPOP_STORAGE_TEMPLATE": "/mnt/{namespace}/{claim}",
            "FSDPOP_METRICS_PORT": "9000",
            "FSDPOP_LIVENESS": "",
            "FSDPOP_SCRAPE_TIMEOUT_SECONDS": "2.5",
            "FSDPOP_ERROR_BACKOFF_SECONDS": "3",
            "FSDPOP_LEADER_ELECTION": "0",
            "FSDPOP_DEEP_VERIFY": "1",
            "POD_NAMESPACE": "ops",
            "FSDPOP_NODE_EXCLUSION_SECONDS": "30",
            "FSDPOP_FAILURE_GRACE_SECONDS": "7",
            "FSDPOP_WATCH_SERVER_TIMEOUT": "5",  # not a variable: the watch timeouts are fixed
            "metrics_port": "1",  # a field's name is not its variable
        }
    )
    assert conf.storage_template == "/mnt/{namespace}/{claim}"
    assert (conf.metrics_port, conf.liveness_endpoint) == (9000, "")  # empty: no liveness
    assert (conf.scrape_timeout_seconds, conf.error_backoff_initial_seconds) == (2.5, 3.0)
    assert (conf.leader_election, conf.deep_verify, conf.lease_namespace) == (False, True, "ops")
    assert (conf.tunables.node_exclusion_seconds, conf.tunables.failure_grace_seconds) == (30, 7)
    assert conf.tunables.max_excluded_nodes == 8
    assert conf.watch_server_timeout == 60
    own = settings.Settings.from_env({"POD_NAMESPACE": "ops", "FSDPOP_LEASE_NAMESPACE": "lease"})
    assert own.lease_namespace == "lease"


@pytest.mark.parametrize("empty", ["FSDPOP_LEADER_ELECTION", "FSDPOP_DEEP_VERIFY"])
def test_an_empty_switch_is_an_unset_one(empty: str) -> None:
    assert settings.Settings.from_env({empty: ""}) == settings.Settings()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"FSDPOP_METRICS_PORT": "80a"}, "FSDPOP_METRICS_PORT='80a' must be a whole number"),
        ({"FSDPOP_METRICS_PORT": ""}, "FSDPOP_METRICS_PORT='' must be a whole number"),
        ({"FSDPOP_MIN_PAUSE_SECONDS": "soon"}, "FSDPOP_MIN_PAUSE_SECONDS='soon' must be a number"),
        ({"FSDPOP_LEADER_ELECTION": "maybe"}, "FSDPOP_LEADER_ELECTION='maybe' must be true or"),
        ({"FSDPOP_MAX_EXCLUDED_NODES": "2.5"}, "FSDPOP_MAX_EXCLUDED_NODES='2.5' must be a whole"),
    ],
)
def test_a_value_that_does_not_read_names_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match="operator environment") as refused:
        settings.Settings.from_env(env)
    assert named in str(refused.value)
