"""The images install requirements/<image>.lock with `pip --require-hashes` (Dockerfile): the
locks must pin exactly what pyproject.toml asks for each image, every pin with its hashes, so a
pyproject edit without `make lock` fails here rather than in an image build."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\;]+)")


def _lock(image: str) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of requirements/<image>.lock."""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (ROOT / "requirements" / f"{image}.lock").read_text().splitlines():
        if m := PIN.match(line):
            name = canonicalize_name(m[1])
            assert name not in pins, f"{image}.lock pins {name} twice"
            pins[name] = (m[2], 0)
        elif line.strip().startswith("--hash=sha256:"):
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
        else:
            assert not line.strip() or line.startswith("#"), f"{image}.lock: unexpected {line!r}"
    return pins


@pytest.mark.parametrize("image", ["operator", "worker", "cli"])
def test_each_image_lock_pins_what_pyproject_asks_for_with_hashes(image: str) -> None:
    """cli is not an image: the krew archives of kubectl-fsdp vendor it (hack/krew.py)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for r in project["optional-dependencies"][image]]
    pins = _lock(image)
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"requirements/{image}.lock has no {name}: run `make lock`"
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements/{image}.lock pins {name}=={version}, pyproject.toml asks {req}: "
            "run `make lock`"
        )
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"requirements/{image}.lock pins without a hash: {unhashed}"


def test_the_operator_image_gets_no_torch_and_the_worker_no_kubernetes_client() -> None:
    assert "torch" not in _lock("operator") and "kubernetes" not in _lock("worker")


def test_the_cli_ships_the_versions_the_operator_image_runs() -> None:
    """fsdpctl's lock (every platform, for krew) is constrained by the operator's: a package both
    use is one version, the one the operator image is tested with."""
    operator, cli = _lock("operator"), _lock("cli")
    assert {n: v for n, (v, _) in cli.items()} == {n: operator[n][0] for n in cli}


def test_both_images_install_their_lock_with_hashes_required() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for image in ("operator", "worker"):
        assert f"COPY requirements/{image}.lock /opt/venv/requirements.lock" in dockerfile
    commands = [c for run in dockerfile.replace("\\\n", " ").split("\n") for c in run.split("&&")]
    from_locks = [c for c in commands if "pip " in c and "requirements.lock" in c]
    assert len(from_locks) == 4
    assert all("--require-hashes" in i and "--no-deps" in i for i in from_locks)
