"""The release workflow (.github/workflows/release.yml) cannot run here (no registry, no Docker
engine): what can be checked is that what it builds exists and what it compares agrees."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _workflow() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text()))


def test_a_version_tag_releases_both_images_from_existing_dockerfile_targets() -> None:
    flow = _workflow()
    assert flow[True]["push"]["tags"] == ["v*.*.*"]  # YAML 1.1 reads the key `on` as True
    steps = flow["jobs"]["release"]["steps"]
    built = {
        s["with"]["target"]: s["with"]["tags"] for s in steps if "build-push" in s.get("uses", "")
    }
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert set(built) == {"operator", "worker"} <= targets
    assert built["operator"].split("/")[-1].startswith("fsdp-operator:")
    assert built["worker"].split("/")[-1].startswith("fsdp-worker:")


def test_the_chart_it_publishes_points_at_the_image_it_pushes() -> None:
    """The workflow rewrites the chart's placeholder registry; the placeholder must be there."""
    values = yaml.safe_load((ROOT / "charts" / "fsdp-operator" / "values.yaml").read_text())
    assert values["image"]["repository"] == "ghcr.io/example/fsdp-operator"
    assert "s|ghcr.io/example/|$REGISTRY/|" in (ROOT / ".github/workflows/release.yml").read_text()


def test_pyproject_the_chart_and_its_app_version_agree() -> None:
    """What the workflow's first step compares with the tag: a release of a version whose
    parts disagree fails there, so keep them equal between releases too."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "fsdp-operator" / "Chart.yaml").read_text())
    assert project == chart["version"] == chart["appVersion"]


def test_make_test_runs_every_test_directory() -> None:
    """`make test` names its suites (the CPU ones beside the cluster ones): a new directory of
    tests must be in one of the two lists, or CI would never run it."""
    makefile = (ROOT / "Makefile").read_text()
    cluster = re.search(r"^CLUSTER_TESTS := (.+)$", makefile, re.M)
    cpu = re.search(r"--durations=15 (tests/\S+ tests/\S+) ", makefile)
    assert cluster and cpu
    named = {*cluster.group(1).split(), *cpu.group(1).split()}
    found = {
        f"tests/{d.name}"
        for d in (ROOT / "tests").iterdir()
        if d.is_dir() and any(d.glob("test_*.py"))
    }
    assert found == named
