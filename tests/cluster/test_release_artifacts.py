"""What the release workflow attaches, built here and used as a user would: `kubectl fsdp`
installed by the real krew from the archive and manifest hack/krew.py writes, and the fsdp-kit
wheel installed into a fresh environment. Neither runs from this checkout: no PYTHONPATH, no
working directory in the repository, and not this venv's site-packages for the CLI.

No cluster: these sit here, not in tests/unit, for their 10-60 s (unpacking the kubernetes
client, importing torch). The archive is built for this machine (linux-amd64, this Python)
from the images' wheelhouse (`make images` fills it from the same PyPI pins), not PyPI.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from hack import kit, krew
from localcluster import controlplane, images

ROOT = Path(__file__).resolve().parents[2]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def _base_python() -> str:
    """The interpreter this venv was made from: a user's python3, without our packages."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _bare_env(path: str) -> dict[str, str]:
    """What a user's shell would hand a command: no PYTHONPATH, no virtual environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PATH": path}


@pytest.fixture(scope="module")
def krew_bin() -> str:
    """krew v0.4.3 from its Go module (localcluster/build-krew.sh; `make krew-bin`), or the
    binary FSDPOP_KREW_BIN names."""
    return str(controlplane.built_dir("build-krew.sh", override="FSDPOP_KREW_BIN"))


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The linux-amd64 archive and fsdp.yaml, as the release workflow builds them."""
    house = images.cache_dir() / "wheels"
    if not any(house.glob(f"pydantic_core-*-cp{PYTHON.replace('.', '')}-*.whl")):
        pytest.fail(f"no wheelhouse for CPython {PYTHON} at {house}: run `make images` first")
    out = tmp_path_factory.mktemp("release")
    krew.main(
        [
            *("build", "--out", str(out), "--platform", "linux-amd64"),
            *("--python", PYTHON, "--wheelhouse", str(house)),
        ]
    )
    return out


def _krew_install(krew_bin: str, release: Path, root: Path) -> Path:
    """`kubectl krew install --manifest --archive` into a krew root of its own."""
    manifest = release / "fsdp.yaml"
    archive = next(release.glob("kubectl-fsdp_*_linux_amd64.tar.gz"))
    env = {**_bare_env(os.environ["PATH"]), "KREW_ROOT": str(root)}
    subprocess.run(
        [krew_bin, "install", f"--manifest={manifest}", f"--archive={archive}"],
        check=True,
        env=env,
        capture_output=True,
    )
    return root / "bin"


def test_krew_installs_the_release_archive_and_kubectl_fsdp_runs_without_a_checkout(
    krew_bin: str, release: Path, tmp_path: Path
) -> None:
    """krew checks the archive's sha256 against the manifest, links `kubectl-fsdp` into its
    bin; kubectl finds it there and it runs on a bare python3 (the base interpreter)."""
    plugins = _krew_install(krew_bin, release, tmp_path / "krew")
    python_dir = tmp_path / "python"
    python_dir.mkdir()
    (python_dir / "python3").symlink_to(_base_python())
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is on every machine that runs the cluster suites"
    path = os.pathsep.join([str(plugins), str(python_dir), str(Path(kubectl).parent)])

    def kubectl_fsdp(*args: str) -> str:
        done = subprocess.run(
            [kubectl, "fsdp", *args],
            env=_bare_env(path),
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    assert kubectl_fsdp("version").startswith(f"fsdpctl {krew.project_version()} (FSDPJob ")
    assert kubectl_fsdp("--help").startswith("usage: kubectl fsdp ")
    installed = yaml.safe_load((release / "fsdp.yaml").read_text())["spec"]["version"]
    assert installed == f"v{krew.project_version()}"


def test_the_launcher_names_the_pythons_it_was_built_for(release: Path, tmp_path: Path) -> None:
    """A python3 the archive has no packages for is refused with what to do, not a traceback."""
    archive = next(release.glob("kubectl-fsdp_*.tar.gz"))
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(tmp_path)], check=True)
    native = tmp_path / "lib" / f"cp{PYTHON.replace('.', '')}"
    native.rename(tmp_path / "lib" / "cp399")
    refused = subprocess.run(
        [_base_python(), str(tmp_path / "kubectl-fsdp"), "version"],
        env=_bare_env(os.environ["PATH"]),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert "built for CPython 3.99" in refused.stderr
    assert "KUBECTL_FSDP_PYTHON" in refused.stderr


@pytest.fixture(scope="module")
def kit_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kit.build(tmp_path_factory.mktemp("kit"))


# What the kit's top-level imports are, as distributions its metadata must require.
_DISTRIBUTIONS = {
    "torch": "torch",
    "pydantic": "pydantic",
    "prometheus_client": "prometheus-client",
    "boto3": "boto3",
    "botocore": "boto3",
}


def _third_party_imports(wheel: Path) -> set[str]:
    """Every top-level module the wheel's code imports that is neither its own nor stdlib."""
    found: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in (n for n in archive.namelist() if n.endswith(".py")):
            for node in ast.walk(ast.parse(archive.read(name))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"fsdp_worker"}


def test_the_kit_wheel_requires_every_package_its_code_imports(kit_wheel: Path) -> None:
    imported = _third_party_imports(kit_wheel)
    assert imported <= set(_DISTRIBUTIONS), f"not mapped to a distribution: {imported}"
    with zipfile.ZipFile(kit_wheel) as archive:
        meta = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
    required = {
        line.split(":", 1)[1].strip().split(";")[0].split("<")[0].split(">")[0].split("=")[0]
        for line in meta.decode().splitlines()
        if line.startswith("Requires-Dist:")
    }
    assert {_DISTRIBUTIONS[m] for m in imported} == required


_PROBE = """
import importlib.util, json
from fsdp_worker import kit
import fsdp_worker.keeper.gang
print(json.dumps({
    "kit": kit.__file__,
    "main": callable(kit.main),
    "found": [m for m in ("fsdp_worker.train", "fsdp_operator") if importlib.util.find_spec(m)],
}))
"""


def test_the_kit_wheel_installs_into_a_fresh_environment_and_imports_outside_the_repo(
    kit_wheel: Path, tmp_path: Path
) -> None:
    """A team's image: torch and the kit's dependencies already there (this venv's, read as a
    plain directory, so its editable checkout is not), then `pip install fsdp-kit`."""
    env_dir = tmp_path / "image"
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "-q"),
            *("--no-deps", "--no-index", str(kit_wheel)),
        ],
        check=True,
    )
    probe = subprocess.run(
        [str(python), "-c", _PROBE],
        env=_bare_env(os.environ["PATH"]),
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    seen = yaml.safe_load(probe.stdout.strip().splitlines()[-1])
    assert seen["kit"].startswith(str(env_dir)) and seen["main"]
    assert seen["found"] == []  # neither the built-in trainer nor the operator
