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


def _step_run(name_part: str) -> str:
    steps = _workflow()["jobs"]["release"]["steps"]
    return str(next(s["run"] for s in steps if name_part in s.get("name", "")))


def test_the_release_attaches_both_crds_and_its_notes_apply_them_as_the_install_guide_does() -> (
    None
):
    """Both CRDs, server-side with --force-conflicts (over CRDs Helm created), as docs/install.md
    says: the notes named one CRD without --force-conflicts, and the upgrade failed."""
    run = _step_run("Chart")
    crds = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert crds == ["fsdpjobs.yaml", "fsdpruntimeprofiles.yaml"]
    release = run[run.index("gh release create") :]
    assert all(f"crds/{name}" in release for name in crds)
    apply = next(line for line in run.splitlines() if "kubectl apply" in line).split()
    assert apply[:4] == ["kubectl", "apply", "--server-side", "--force-conflicts"]
    assert [w.rsplit("/", 1)[-1] for w in apply[5::2]] == crds
    guide = (ROOT / "docs" / "install.md").read_text()
    assert "kubectl apply --server-side --force-conflicts -f charts/fsdp-operator/crds/" in guide


def test_the_release_builds_and_attaches_what_make_release_artifacts_builds() -> None:
    """The wheels (fsdpctl's, the kit's) and the krew archives with fsdp.yaml, built by the same
    commands as `make release-artifacts` (which tests/cluster/test_release_artifacts.py's
    builders run here), all attached."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("release-artifacts: venv") :].split("\n\n")[0]
    made = [line.split("$(VPY) ", 1)[1] for line in recipe.splitlines() if "$(VPY) " in line]
    lines = _step_run("krew archives").replace("\\\n", " ").splitlines()
    built = [line.split(maxsplit=1)[1] for line in lines if line.startswith("python -m ")]
    assert len(made) == 3 and len(built) == 4  # its build tools, then the three builds
    assert made[:2] == built[1:3]
    assert built[3].startswith("-m hack.krew build ")  # with the tag's version and URIs
    assert "--out dist " in built[3] and made[2].endswith("--out dist")
    assert "dist/*" in _step_run("Chart")


def test_the_kit_is_released_under_the_project_version() -> None:
    """fsdp-kit is built from the same tree: one version, which the workflow checks too."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    kit = tomllib.loads((ROOT / "packages" / "fsdp-kit" / "pyproject.toml").read_text())
    assert kit["project"]["version"] == project
    assert "packages/fsdp-kit/pyproject.toml" in _step_run("one version")
