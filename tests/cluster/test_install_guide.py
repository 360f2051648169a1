"""Every command of docs/install.md, the README and the chart's NOTES, as a user copies it,
against the local cluster: each `kubectl apply` is admitted by a server-side dry run, each
`helm` install/upgrade/show renders, the CRD upgrade goes over CRDs whose fields Helm owns, and
the NOTES `helm install` prints name what the chart made. Only the registry, the storage class
and NOTES' placeholders are substituted (tests/install_guide.py, unit-tested in
tests/unit/test_install_guide_parse.py). fsdpctl lines are parsed by tests/unit/test_cli_docs.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import stack
from localcluster import components, controlplane
from tests import install_guide as guide
from tests.install_guide import Kind

pytestmark = pytest.mark.cluster
REGISTRY = "registry.local/ml"
NAMESPACE = "team-a"  # the guide's tenant namespace: its Kueue objects name it themselves
COMMANDS = guide.guide_commands(registry=REGISTRY, storage_class=components.STORAGE_CLASS)
KUEUE_APPLIES = [
    c for c in COMMANDS if c.kind is Kind.APPLY and "kueue.x-k8s.io" in (c.stdin or "")
]
"""The guide's Kueue objects: admitted where Kueue runs (tests/integration/test_kueue.py)."""
APPLIES = [c for c in COMMANDS if c.kind is Kind.APPLY and c not in KUEUE_APPLIES]
RENDERS = [c for c in COMMANDS if c.kind is Kind.HELM and guide.helm_template_argv(c.words)]


@pytest.fixture(scope="module")
def tenant(cluster: controlplane.Cluster) -> Iterator[controlplane.Cluster]:
    """The CRDs installed, the guide's tenant namespace made (as its section 3 does) and its
    runtime profiles gpu-rdma and gpu-efa (as its `helm upgrade ... -f` of their values does):
    the 7B jobs name them, and the chart's admission policies, where an earlier test installed
    them, refuse a job naming a profile that does not exist. Only the profiles made here go."""
    stack.install_crd(cluster)
    made = cluster.kubectl("create", "namespace", NAMESPACE, check=False).returncode == 0
    docs = _guide_profiles()
    names = [f"fsdpruntimeprofile/{d['metadata']['name']}" for d in docs]
    fresh = [n for n in names if cluster.kubectl("get", n, check=False).returncode != 0]
    cluster.kubectl("apply", "-f", "-", input=stack.as_list(docs))
    yield cluster
    if fresh:
        cluster.kubectl("delete", *fresh, "--wait=false", check=False)
    if made:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _guide_profiles() -> list[dict[str, Any]]:
    """The FSDPRuntimeProfiles of examples/chart-values/ (gpu-rdma, gpu-efa), rendered by the
    chart (their registry substituted as the jobs' is)."""
    profiles: dict[str, Any] = {}
    for path in sorted((guide.ROOT / "examples" / "chart-values").glob("*.yaml")):
        text = guide.substitute(
            path.read_text(), registry=REGISTRY, storage_class=components.STORAGE_CLASS
        )
        profiles |= yaml.safe_load(text).get("runtimeProfiles", {})
    docs = stack.render_chart(json_values=[f"runtimeProfiles={json.dumps(profiles)}"])
    return [
        d for d in docs if d["kind"] == "FSDPRuntimeProfile" and d["metadata"]["name"] in profiles
    ]


def _helm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """helm as the guide runs it, from a checkout's root (its paths are relative)."""
    if argv[0] == "template":
        argv = [*argv, "--kube-version", stack.KUBE_VERSION]
    return subprocess.run(
        [str(stack.helm()), *argv], capture_output=True, text=True, cwd=guide.ROOT
    )


def _stdin(command: guide.Command) -> str | None:
    """What the command reads: a heredoc or echo body, or the output of the command piped in."""
    if command.piped_from is None:
        return command.stdin
    argv = guide.helm_template_argv(command.piped_from)
    assert argv is not None, f"{command}: only helm output is piped into kubectl"
    done = _helm(argv)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def _groups_not_served(cluster: controlplane.Cluster, manifests: str) -> set[str]:
    """API groups the objects use that this cluster does not serve (Kueue's, unless installed)."""
    served = set(cluster.kubectl("api-versions").stdout.split())
    wanted = {d["apiVersion"] for d in yaml.safe_load_all(manifests) if d}
    return {version.split("/")[0] for version in wanted - served}


def apply_argv(command: guide.Command, *, dry_run: bool = True) -> tuple[list[str], str | None]:
    """The apply's argv and stdin: example files substituted, a piped command's output."""
    argv, stdin = guide.apply_input(
        command,
        namespace=NAMESPACE,
        registry=REGISTRY,
        storage_class=components.STORAGE_CLASS,
        dry_run=dry_run,
    )
    return argv, stdin if command.piped_from is None else _stdin(command)


@pytest.mark.parametrize("command", APPLIES, ids=str)
def test_each_apply_in_the_guide_is_admitted(
    tenant: controlplane.Cluster, command: guide.Command
) -> None:
    argv, stdin = apply_argv(command)
    missing = _groups_not_served(tenant, stdin or "")
    assert not missing, f"{command}: the local cluster does not serve {sorted(missing)}"
    done = tenant.kubectl(*argv, input=stdin, check=False)
    assert done.returncode == 0, f"{command}\n{done.stderr}"


@pytest.mark.parametrize("command", RENDERS, ids=str)
def test_each_helm_command_in_the_guide_renders(command: guide.Command) -> None:
    argv = guide.helm_template_argv(command.words)
    assert argv is not None
    done = _helm(argv)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    assert [d for d in yaml.safe_load_all(done.stdout) if d], f"{command} rendered nothing"


def test_the_crd_upgrade_takes_over_fields_helm_owns(tenant: controlplane.Cluster) -> None:
    """install.md, "Upgrade": Helm created the CRDs (its field manager owns their fields); the
    guide's server-side apply conflicts without --force-conflicts and succeeds with it."""
    (upgrade,) = [
        c
        for c in APPLIES
        if c.doc == "install.md" and "--force-conflicts" in c.words and "crds/" in c.words[-1]
    ]
    crd = tenant.get_json("crd", "fsdpjobs.fsdpoperator.io")
    crd["metadata"].pop("managedFields", None)  # resourceVersion stays: CRD updates need it
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "an older chart"
    tenant.kubectl("replace", "--field-manager=helm", "-f", "-", input=json.dumps(crd))
    try:
        argv, stdin = apply_argv(upgrade)
        plain = [w for w in argv if w != "--force-conflicts"]
        refused = tenant.kubectl(*plain, input=stdin, check=False)
        assert refused.returncode != 0 and "conflict" in refused.stderr.lower(), refused.stderr
        argv, stdin = apply_argv(upgrade, dry_run=False)
        done = tenant.kubectl(*argv, input=stdin)
        assert "serverside-applied" in done.stdout, done.stdout
    finally:  # the CRDs as the repository has them, whatever happened above
        tenant.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(guide.ROOT / "crds")
        )
    schema = tenant.get_json("crd", "fsdpjobs.fsdpoperator.io")["spec"]["versions"][0]["schema"]
    assert schema["openAPIV3Schema"].get("description") != "an older chart"


def _rendered_notes(tmp_path: Path) -> str:
    """NOTES as `helm install` prints it: `helm template` does not render NOTES, so a copy of
    the chart includes it in a ConfigMap."""
    chart = tmp_path / "fsdp-operator"
    shutil.copytree(guide.CHART, chart)
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "fsdp-operator/templates/NOTES.txt" . | toJson }}}\n'
    )
    done = _helm(
        ["template", stack.OP_SA, str(chart), "-n", stack.OP_NS, "-s", "templates/zz-notes.yaml"]
    )
    assert done.returncode == 0, done.stderr
    notes: str = yaml.safe_load(done.stdout)["data"]["notes"]
    return notes


def test_the_rendered_notes_commands_name_what_the_chart_made(
    tenant: controlplane.Cluster, tmp_path: Path
) -> None:
    notes = _rendered_notes(tmp_path)
    commands = [
        c
        for c in guide.guide_commands(
            registry=REGISTRY, storage_class=components.STORAGE_CLASS, notes=notes
        )
        if c.doc == guide.NOTES.name
    ]
    raw = [c for c in COMMANDS if c.doc == guide.NOTES.name]
    assert [c.kind for c in commands] == [c.kind for c in raw]
    (lease,) = [c for c in commands if "lease" in c.words]
    deployment = next(d for d in stack.render_chart() if d["kind"] == "Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert lease.words[lease.words.index("lease") + 1] == env["FSDPOP_LEASE_NAME"]
    assert lease.words[lease.words.index("-n") + 1] == stack.OP_NS
    for command in (c for c in commands if c.kind is Kind.APPLY):
        argv, stdin = apply_argv(command)
        done = tenant.kubectl(*argv, input=stdin, check=False)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
