"""Truth tables for the process-node agent's pure parts: expansion, env, status, DNS answers."""

from __future__ import annotations

import socket
import struct

import pytest

from localcluster.agent import dns, expand, status


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("$A", "$A"),
        ("a$", "a$"),
        ("$()", "$()"),
        ("100%$", "100%$"),
    ],
)
def test_expansion_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand.expand(text, {"A": "1", "B": "2"}) == expected


POD = {
    "metadata": {"name": "w-0", "namespace": "ns", "uid": "u1", "labels": {"team": "ml"},
                 "annotations": {"a/b": "c"}},
    "spec": {"nodeName": "node-1"},
    "status": {"podIP": "10.244.1.2"},
}  # fmt: skip


def test_env_resolves_field_refs_config_maps_and_earlier_vars() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
            {"name": "ANN",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a/b']"}}},
            {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "no", "key": "k",
                                                              "optional": True}}},
            {"name": "COMBO", "value": "$(POD)@$(NODE)"},
        ],
    }  # fmt: skip
    lookup = {("ns", "cfg"): {"k": "v"}}
    env = expand.container_env(
        POD, container, base={"NODE": "n"}, configmaps=lambda ns, name: lookup.get((ns, name))
    )
    assert env == {"NODE": "n", "POD": "w-0", "TEAM": "ml", "ANN": "c", "CM": "v",
                   "COMBO": "w-0@n"}  # fmt: skip


def test_secret_refs_and_missing_command_are_clear_errors() -> None:
    secret = {"name": "c", "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}
    with pytest.raises(expand.EnvError, match="secretKeyRef"):
        expand.container_env(POD, secret, base={}, configmaps=lambda ns, name: None)
    with pytest.raises(expand.EnvError, match="command or args"):
        expand.container_argv({"name": "c"}, {})


@pytest.mark.parametrize(
    ("returncode", "oom", "code", "reason"),
    [
        (0, False, 0, "Completed"),
        (3, False, 3, "Error"),
        (-15, False, 143, "Error"),
        (-9, True, 137, "OOMKilled"),
    ],
)
def test_exit_codes_and_reasons(returncode: int, oom: bool, code: int, reason: str) -> None:
    assert status.exit_code(returncode) == code
    assert status.exit_reason(code, oom=oom) == reason


def _container(state: status.State, code: int | None = None) -> status.Container:
    return status.Container("c", "img", state=state, exit_code=code)


@pytest.mark.parametrize(
    ("states", "phase"),
    [
        ([_container(status.State.WAITING)], "Pending"),
        ([_container(status.State.RUNNING)], "Running"),
        ([_container(status.State.TERMINATED, 0)], "Succeeded"),
        ([_container(status.State.TERMINATED, 0), _container(status.State.TERMINATED, 1)],
         "Failed"),
        ([_container(status.State.TERMINATED, 1), _container(status.State.RUNNING)], "Running"),
    ],
)  # fmt: skip
def test_phase(states: list[status.Container], phase: str) -> None:
    assert status.phase(states) == phase


def test_pod_status_keeps_unchanged_transition_times() -> None:
    old = {"conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": "T0"}]}
    out = status.pod_status(
        old=old, containers=[_container(status.State.RUNNING)], init_done=True,
        host_ip="10.0.0.1", pod_ip="10.0.0.2", start_time="T0", now="T1",
    )  # fmt: skip
    conditions = {c["type"]: c for c in out["conditions"]}
    assert conditions["Initialized"]["lastTransitionTime"] == "T0"
    assert conditions["Ready"] == {"type": "Ready", "status": "True", "lastTransitionTime": "T1",
                                   "lastProbeTime": None}  # fmt: skip
    assert out["phase"] == "Running"
    assert out["podIP"] == "10.0.0.2"


def _query(name: str, qtype: int = dns.TYPE_A) -> bytes:
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)


def _records() -> dns.Records:
    records = dns.Records()
    records.update("ADDED", {
        "metadata": {"namespace": "ns", "name": "peers-abc",
                     "labels": {"kubernetes.io/service-name": "peers"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.1.2"], "hostname": "a", "conditions": {"ready": True}},
            {"addresses": ["10.244.2.2"], "hostname": "b", "conditions": {"ready": False}},
        ],
    })  # fmt: skip
    return records


def test_dns_answers_pod_and_service_names_with_ready_addresses() -> None:
    records = _records()
    reply = dns.answer(_query("a.peers.ns.svc.cluster.local"), records)
    ident, flags, _, answers, _, _ = struct.unpack_from("!HHHHHH", reply)
    assert (ident, flags & 0xF, answers) == (7, 0, 1)
    assert socket.inet_ntoa(reply[-4:]) == "10.244.1.2"
    service = dns.answer(_query("peers.ns.svc.cluster.local"), records)
    assert struct.unpack_from("!HHHHHH", service)[3] == 1, "not-ready endpoints are left out"


def test_dns_unknown_names_are_nxdomain_and_aaaa_is_empty() -> None:
    records = _records()
    missing = dns.answer(_query("nope.ns.svc.cluster.local"), records)
    assert struct.unpack_from("!HH", missing)[1] & 0xF == dns.RCODE_NXDOMAIN
    aaaa = dns.answer(_query("a.peers.ns.svc.cluster.local", qtype=28), records)
    _, flags, _, answers, _, _ = struct.unpack_from("!HHHHHH", aaaa)
    assert (flags & 0xF, answers) == (0, 0)


def test_a_container_waiting_to_restart_keeps_the_pod_running() -> None:
    backing_off = status.Container(
        "c", "img", state=status.State.WAITING, reason=status.Reason.BACK_OFF,
        last_terminated={"exitCode": 5},
    )  # fmt: skip
    assert status.phase([backing_off]) == "Running"
