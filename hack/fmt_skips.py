"""Count the `# fmt: skip` marks in the repository's Python; fail when there are more than allowed.

`ruff format` owns layout. A `# fmt: skip` is kept only where a statement is an aligned table
(columns a reader scans down); `make lint` runs this with the Makefile's FMT_SKIPS_MAX, so the
count can fall but never grow unnoticed:

    python -m hack.fmt_skips [--max N] [--list]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "# fmt: skip"


def python_files(root: Path = ROOT) -> list[Path]:
    """Tracked *.py files (git's list, so nothing under .venv or a cache is counted)."""
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return [root / name for name in listed]


def marks(text: str) -> int:
    """The comments that are the mark (a string that mentions it is not one)."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return sum(1 for t in tokens if t.type == tokenize.COMMENT and t.string.strip() == MARK)


def count(paths: list[Path]) -> dict[Path, int]:
    """Each file's number of marks, files without one left out."""
    found = {p: marks(p.read_text()) for p in paths if p.is_file()}
    return {p: n for p, n in found.items() if n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.fmt_skips", description=__doc__)
    parser.add_argument("--max", type=int, default=None, help="fail when the count exceeds this")
    parser.add_argument("--list", action="store_true", help="each file's count, most first")
    args = parser.parse_args(argv)
    found = count(python_files())
    total = sum(found.values())
    for path, n in sorted(found.items(), key=lambda kv: -kv[1]) if args.list else ():
        print(f"{n:4d}  {path.relative_to(ROOT)}")
    print(f"{total} `{MARK}` in {len(found)} files")
    if args.max is not None and total > args.max:
        print(
            f"fmt_skips: {total} > FMT_SKIPS_MAX={args.max}: let `ruff format` lay the new ones "
            "out; keep the mark only on aligned tables",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
