"""Build the krew archives of `kubectl fsdp` and the manifest that names them.

    python -m hack.krew build --version 0.1.0 --out dist/ \\
        [--platform linux-amd64 ...] [--python 3.11 ...] [--wheelhouse DIR] [--uri-base URL]

A Python CLI under krew: krew installs one archive per platform, checked by its sha256, and
links its `bin` onto the PATH. Each archive here is a launcher (hack/krew-plugin/kubectl-fsdp,
run by the user's python3) beside the packages it imports, unpacked from wheels: the pure ones
once under lib/, those built for one CPython (pydantic-core, pyyaml, ...) under lib/cpXY/ for
each Python the release supports. A zipapp could not hold them (extension modules do not load
from a zip) and a per-interpreter binary (PyInstaller) cannot be built for macOS on Linux.

Every wheel is the version requirements/cli.lock pins and is checked against its hashes
(`pip download --require-hashes`); with --wheelhouse it comes from that directory
(`--no-index`, as the test here does from the images' wheel cache), otherwise from PyPI (the
release workflow). The project's own wheel is built from this tree. Nothing is installed into
any Python; the output is the archives and `fsdp.yaml` (the krew index's plugins/fsdp.yaml).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "hack" / "krew-plugin"
LOCK = ROOT / "requirements" / "cli.lock"
# krew's os/arch -> the wheel platform tags pip may pick for it (pip expands a macOS tag to
# older versions, never a manylinux one): glibc 2.28 or macOS 11 at least.
PLATFORM_TAGS = {
    "linux-amd64": [f"manylinux{v}_x86_64" for v in ("_2_28", "_2_17", "2014", "_2_5", "1")],
    "linux-arm64": [f"manylinux{v}_aarch64" for v in ("_2_28", "_2_17", "2014")],
    # pip takes a macOS tag as "this version or older": macOS 11 and later
    "darwin-amd64": ["macosx_11_0_x86_64"],
    "darwin-arm64": ["macosx_11_0_arm64"],
}
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
PURE_TAGS = ("-py3-none-any.whl", "-py2.py3-none-any.whl")


@dataclass(frozen=True)
class Archive:
    """One built archive: what krew's manifest says of it."""

    platform: str
    path: Path
    sha256: str


def project_version() -> str:
    """pyproject.toml's version: the wheel inside says it, so the archive must too."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def project_wheel(out: Path) -> Path:
    """fsdp-operator's wheel (fsdpctl and the CLI) from this tree, with the venv's setuptools."""
    pip = (sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation")
    subprocess.run([*pip, "-w", str(out), str(ROOT)], check=True)
    return next(out.glob("fsdp_operator-*.whl"))


def download(*, platform: str, python: str, dest: Path, wheelhouse: Path | None) -> list[Path]:
    """The wheels requirements/cli.lock pins for one platform and Python, hashes checked."""
    where = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
    tags = [arg for tag in PLATFORM_TAGS[platform] for arg in ("--platform", tag)]
    pip = (sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes")
    wanted = ("--only-binary", ":all:", "--implementation", "cp", "--python-version", python)
    subprocess.run([*pip, *wanted, *tags, *where, "-r", str(LOCK), "-d", str(dest)], check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheel: Path, into: Path) -> None:
    """A wheel's files as pip places a purelib/platlib-only distribution (what these are)."""
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            top = name.split("/", 1)[0]
            if top.endswith(".data") or name.startswith("/") or ".." in name.split("/"):
                raise SystemExit(f"{wheel.name}: {name} would land outside site-packages")
            archive.extract(name, into)


def stage(
    *, platform: str, pythons: Sequence[str], wheels: Path, wheelhouse: Path | None, into: Path
) -> None:
    """The archive's tree: the launcher, LICENSE, lib/ and lib/cpXY/ per Python."""
    lib = into / "lib"
    for python in pythons:
        dest = wheels / python
        got = download(platform=platform, python=python, dest=dest, wheelhouse=wheelhouse)
        _place(got, lib=lib, native=lib / ("cp" + python.replace(".", "")))
    launcher = into / "kubectl-fsdp"
    launcher.write_bytes((PLUGIN / "kubectl-fsdp").read_bytes())
    launcher.chmod(0o755)
    (into / "LICENSE").write_bytes((ROOT / "LICENSE").read_bytes())


def _place(wheels: Sequence[Path], *, lib: Path, native: Path) -> None:
    native.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        pure = wheel.name.endswith(PURE_TAGS)
        if not pure or not any(lib.glob(wheel.name.split("-")[0] + "-*.dist-info")):
            unpack(wheel, lib if pure else native)


def pack(tree: Path, out: Path) -> str:
    """tree as a reproducible .tar.gz (sorted, no owners or times); its sha256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        for path in sorted(tree.rglob("*")):
            info = tar.gettarinfo(str(path), str(path.relative_to(tree)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if path.is_dir() or info.mode & 0o100 else 0o644
            if path.is_file():
                tar.addfile(info, path.open("rb"))
            else:
                tar.addfile(info)
    out.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def manifest(*, version: str, archives: Sequence[Archive], uri_base: str) -> dict[str, Any]:
    """hack/krew-plugin/fsdp.yaml with the version and one platform per archive."""
    doc: dict[str, Any] = yaml.safe_load((PLUGIN / "fsdp.yaml").read_text())
    doc["spec"]["version"] = f"v{version}"
    doc["spec"]["homepage"] = uri_base.split("/releases/")[0]
    doc["spec"]["platforms"] = [_platform(a, uri_base) for a in archives]
    return doc


def _platform(archive: Archive, uri_base: str) -> dict[str, Any]:
    os_name, arch = archive.platform.split("-")
    return {
        "selector": {"matchLabels": {"os": os_name, "arch": arch}},
        "uri": f"{uri_base.rstrip('/')}/{archive.path.name}",
        "sha256": archive.sha256,
        "bin": "kubectl-fsdp",
    }


def build(args: argparse.Namespace) -> list[Archive]:
    """Every archive of args.platform, then fsdp.yaml naming them, under args.out."""
    args.out.mkdir(parents=True, exist_ok=True)
    archives = []
    with tempfile.TemporaryDirectory(prefix="krew-") as scratch:
        work = Path(scratch)
        own = project_wheel(work / "project")
        for platform in args.platform:
            tree = work / platform / "tree"
            stage(
                platform=platform,
                pythons=args.python,
                wheels=work / platform,
                wheelhouse=args.wheelhouse,
                into=tree,
            )
            unpack(own, tree / "lib")
            path = args.out / f"kubectl-fsdp_v{args.version}_{platform.replace('-', '_')}.tar.gz"
            archives.append(Archive(platform, path, pack(tree, path)))
    doc = manifest(version=args.version, archives=archives, uri_base=args.uri_base)
    (args.out / "fsdp.yaml").write_text(yaml.dump(doc, Dumper=_Literal, sort_keys=False))
    return archives


class _Literal(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, as the template writes them (and the index's reviewers
    read them)."""


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Literal.add_representer(str, _block)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="the archives and fsdp.yaml")
    make.add_argument("--version", default=project_version(), help="default: pyproject's")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--platform", action="append", choices=sorted(PLATFORM_TAGS))
    make.add_argument("--python", action="append", help=f"default: {', '.join(PYTHONS)}")
    make.add_argument("--wheelhouse", type=Path, help="wheels from here, not PyPI")
    make.add_argument(
        "--uri-base",
        default=f"https://github.com/example/fsdp-operator/releases/download/v{project_version()}",
        help="where the release serves the archives",
    )
    args = parser.parse_args(argv)
    args.platform = args.platform or sorted(PLATFORM_TAGS)
    args.python = args.python or list(PYTHONS)
    if args.version != project_version():
        parser.error(f"--version {args.version}: pyproject.toml says {project_version()}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    for archive in build(_arguments(argv)):
        print(f"{archive.sha256}  {archive.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
