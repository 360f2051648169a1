"""`make lint` fails when `# fmt: skip` marks grow past the Makefile's FMT_SKIPS_MAX."""

from __future__ import annotations

import re
from pathlib import Path

from hack import fmt_skips

ROOT = Path(__file__).resolve().parents[2]


def test_marks_are_counted_per_file_and_files_without_them_left_out(tmp_path: Path) -> None:
    table = tmp_path / "table.py"
    table.write_text("X = {\n    'a':   1,\n    'bb':  2,\n}  # fmt: skip\nY = 1  # fmt: skip\n")
    plain = tmp_path / "plain.py"
    plain.write_text('Z = "a string that says # fmt: skip is not a mark"\n')
    assert fmt_skips.count([table, plain, tmp_path / "gone.py"]) == {table: 2}


def test_the_gate_fails_above_the_allowance_and_passes_at_it() -> None:
    total = sum(fmt_skips.count(fmt_skips.python_files()).values())
    assert fmt_skips.main(["--max", str(total)]) == 0
    assert fmt_skips.main(["--max", str(total - 1)]) == 1


def test_make_lint_holds_the_repository_to_its_allowance() -> None:
    makefile = (ROOT / "Makefile").read_text()
    allowed = int(re.search(r"^FMT_SKIPS_MAX := (\d+)$", makefile, re.M).group(1))  # type: ignore[union-attr]
    assert "-m hack.fmt_skips --max $(FMT_SKIPS_MAX)" in makefile
    assert sum(fmt_skips.count(fmt_skips.python_files()).values()) <= allowed
