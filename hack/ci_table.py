"""Render bench/results/ci_runs.tsv as a Markdown table into docs/benchmarks.md.

The table sits between the BEGIN and END marker comments on the page, newest run first; the
rest of the page is left as written. `.ci/run` calls this after hack/ci_record.py appended its
row, and tests/unit/test_ci_record.py checks that the committed page is what this renders, so
the table is never edited by hand. It reads the results file and never changes it.

    python3 -m hack.ci_table [--check]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hack import ci_record

PAGE = ci_record.ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- ci-runs:begin (rendered by hack/ci_table.py from bench/results/ci_runs.tsv) -->"
END = "<!-- ci-runs:end -->"
HEADINGS = ("date (UTC)", "commit", "machine", "cache", "wall time", "result", "passed", "skipped")


def wall_time(seconds: str) -> str:
    """`1688` -> `28 min 8 s`; an unknown cell stays unknown."""
    if not seconds.isdigit():
        return seconds
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def render(rows: Sequence[dict[str, str]]) -> str:
    """The Markdown table of `rows` (oldest first, as in the file), newest first."""
    lines = ["| " + " | ".join(HEADINGS) + " |", "|" + " --- |" * len(HEADINGS)]
    for row in reversed(rows):
        commit = row["commit"] if row["commit"] == ci_record.UNKNOWN else f"`{row['commit']}`"
        cells = (
            row["date"].replace("T", " ").removesuffix("Z"),
            commit,
            row["machine"],
            row["cache"],
            wall_time(row["seconds"]),
            row["result"],
            row["passed"],
            row["skipped"],
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def place(page: str, table: str) -> str:
    """`page` with whatever stood between its markers replaced by `table`."""
    head, begin, rest = page.partition(BEGIN)
    middle, end, tail = rest.partition(END)
    if not begin or not end or BEGIN in tail or END in middle:
        raise ValueError(f"the page needs one {BEGIN!r} line and, after it, one {END!r} line")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def rendered(page_path: Path, results: Path) -> str:
    """What the page at `page_path` reads once its table is rendered from `results`."""
    return place(page_path.read_text(), render(ci_record.read(results)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--results", type=Path, default=ci_record.RESULTS)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = rendered(args.page, args.results)
    if text == args.page.read_text():
        return 0
    if args.check:
        print(f"{args.page} is stale: run python3 -m hack.ci_table", file=sys.stderr)
        return 1
    args.page.write_text(text)
    print(f"{args.page}: rendered {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
