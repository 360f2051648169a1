"""The krew manifest hack/krew.py writes: what `kubectl krew install` and the krew index read.
The real krew installs one (tests/cluster/test_release_artifacts.py); this checks every
platform's entry without building any archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import krew

BASE = "https://github.com/acme/fsdp-operator/releases/download/v0.1.0"


def _archives() -> list[krew.Archive]:
    return [
        krew.Archive(p, Path(f"/out/kubectl-fsdp_v0.1.0_{p.replace('-', '_')}.tar.gz"), "ab" * 32)
        for p in sorted(krew.PLATFORM_TAGS)
    ]


def test_each_archive_is_one_platform_of_the_manifest_with_its_uri_and_sha256() -> None:
    doc = krew.manifest(version="0.1.0", archives=_archives(), uri_base=BASE)
    assert doc["kind"] == "Plugin" and doc["metadata"]["name"] == "fsdp"
    assert doc["spec"]["version"] == "v0.1.0"
    assert doc["spec"]["homepage"] == "https://github.com/acme/fsdp-operator"
    platforms = doc["spec"]["platforms"]
    selectors = [p["selector"]["matchLabels"] for p in platforms]
    assert selectors == [
        {"os": "darwin", "arch": "amd64"},
        {"os": "darwin", "arch": "arm64"},
        {"os": "linux", "arch": "amd64"},
        {"os": "linux", "arch": "arm64"},
    ]
    assert platforms[2]["uri"] == f"{BASE}/kubectl-fsdp_v0.1.0_linux_amd64.tar.gz"
    assert all(p["sha256"] == "ab" * 32 and p["bin"] == "kubectl-fsdp" for p in platforms)
    assert doc["spec"]["shortDescription"] and doc["spec"]["description"].endswith("\n")


def test_a_version_other_than_the_projects_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The wheel inside says pyproject's version; an archive named otherwise would lie."""
    with pytest.raises(SystemExit) as refused:
        krew.main(["build", "--out", "/nonexistent", "--version", "9.9.9"])
    assert refused.value.code == 2
    said = f"--version 9.9.9: pyproject.toml says {krew.project_version()}"
    assert said in capsys.readouterr().err
