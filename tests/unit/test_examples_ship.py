"""Each example job ships with everything it names: every claim it mounts is in an example
claims file the guide applies, every PriorityClass in examples/priorityclass.yaml, and every
tenant claim is ReadWriteMany and names a storage class (a placeholder the guide says to set),
so it neither stays Pending on a cloud's RWO default nor goes unnoticed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import install_guide as guide

EXAMPLES = guide.ROOT / "examples"


def _docs(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == kind
    ]


JOBS = _docs("FSDPJob")
CLAIMS = _docs("PersistentVolumeClaim")


def _claims_named(job: dict[str, Any]) -> set[str]:
    spec = job["spec"]
    named = {spec["checkpoint"]["claimName"]} if spec["checkpoint"].get("claimName") else set()
    for volume in spec.get("template", {}).get("spec", {}).get("volumes", []):
        if claim := volume.get("persistentVolumeClaim"):
            named.add(claim["claimName"])
    return named


def _applied_files() -> set[str]:
    """The example files the install guide applies."""
    return {
        Path(path).name
        for command in guide.guide_commands(registry="r", storage_class="c")
        if command.kind is guide.Kind.APPLY
        for path in guide.files_named(command.words)
    }


@pytest.mark.parametrize(("path", "job"), JOBS, ids=[p.name for p, _ in JOBS])
def test_each_claim_a_job_mounts_ships_beside_it(path: Path, job: dict[str, Any]) -> None:
    shipped = {doc["metadata"]["name"] for _, doc in CLAIMS}
    assert _claims_named(job) <= shipped, f"{path.name} mounts claims no example makes"


@pytest.mark.parametrize(("path", "job"), JOBS, ids=[p.name for p, _ in JOBS])
def test_each_priority_class_a_job_names_ships(path: Path, job: dict[str, Any]) -> None:
    named = job["spec"].get("template", {}).get("spec", {}).get("priorityClassName")
    shipped = {doc["metadata"]["name"] for _, doc in _docs("PriorityClass")}
    assert named is None or named in shipped, f"{path.name}: {named}"


@pytest.mark.parametrize(("path", "claim"), CLAIMS, ids=[p.name for p, _ in CLAIMS])
def test_each_claim_is_rwx_and_names_the_class_placeholder(
    path: Path, claim: dict[str, Any]
) -> None:
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], path.name
    assert claim["spec"]["storageClassName"] == guide.STORAGE_CLASS_PLACEHOLDER, path.name


def test_the_guide_applies_the_gpu_examples_with_their_claims_and_priority_class() -> None:
    applied = _applied_files()
    for job, claims in (
        ("llama-1b-h100.yaml", "pvc-llama-1b.yaml"),
        ("llama-7b-rdma.yaml", "pvc-llama-7b.yaml"),
        ("llama-7b-efa.yaml", "pvc-llama-7b.yaml"),
    ):
        assert {job, claims, "priorityclass.yaml"} <= applied, job
    assert "pvc-ckpt.yaml" in applied  # the claim `ckpt` of NOTES' first job and tiny-cpu


def test_the_guide_documents_storage_classes_upgrade_and_uninstall() -> None:
    text = guide.INSTALL.read_text()
    for words in ("efs-sc", "Filestore", "azurefile", "NFS", "ReadWriteMany"):
        assert words in text, words
    assert "--server-side --force-conflicts -f charts/fsdp-operator/crds/" in text
    uninstall = text.split("## 7. Uninstall", 1)[1].split("\n## ", 1)[0]
    assert "unsupervised" in uninstall
    order = ["kubectl delete fsdpjobs", "helm uninstall", "kubectl delete -f charts/"]
    positions = [uninstall.index(step) for step in order]
    assert positions == sorted(positions), "jobs first, then the chart, then the CRDs"
