"""Build the fsdp-kit wheel: the trainer kit as its own distribution, for a team's own image.

    python -m hack.kit build --out dist/

packages/fsdp-kit/pyproject.toml names the distribution and which packages of
worker/fsdp_worker it ships (the kit, what it imports, the in-place keeper; not the built-in
trainer). A pyproject cannot reach above its own folder, so this copies that file, its README,
the LICENSE and those packages into a scratch tree and builds the wheel there with this
Python's pip and setuptools (no build isolation: nothing is downloaded). Prints the wheel's
path.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "packages" / "fsdp-kit"
SOURCES = ROOT / "worker"


def shipped() -> list[str]:
    """The dotted packages packages/fsdp-kit/pyproject.toml ships."""
    project = tomllib.loads((KIT / "pyproject.toml").read_text())
    return list(project["tool"]["setuptools"]["packages"])


def stage(into: Path) -> None:
    """The kit's pyproject, README and LICENSE, and each shipped package's own modules."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(KIT / name, into / name)
    shutil.copy(ROOT / "LICENSE", into / "LICENSE")
    for package in shipped():
        folder = Path(*package.split("."))
        (into / folder).mkdir(parents=True)
        for module in (SOURCES / folder).glob("*.py"):  # subpackages are named on their own
            shutil.copy(module, into / folder / module.name)


def build(out: Path) -> Path:
    """The wheel, under out."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fsdp-kit-") as scratch:
        tree = Path(scratch)
        stage(tree)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"),
                *("--no-build-isolation", "-w", str(out), str(tree)),
            ],
            check=True,
        )
    return max(out.glob("fsdp_kit-*.whl"), key=lambda p: p.stat().st_mtime)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="the wheel").add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
