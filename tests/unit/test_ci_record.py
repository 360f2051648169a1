"""The CI record: `.ci/run`'s row in bench/results/ci_runs.tsv, and the table docs render."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import ci_record, ci_table

# Lines as `make test` prints them: pytest -q's summaries (the cluster suites', then the CPU
# suites' after the echo), amid other tools' output that must not count.
MAKE_TEST_LOG = """\
.venv/bin/ruff format --check .
214 files already formatted
Contracts: 9 kept, 0 broken.
Success: no issues found in 118 source files
........................................................s............ [ 98%]
===== 153 passed, 1 skipped, 2 warnings in 1500.20s (0:25:00) =====
== tests/unit and tests/worker (ran beside the above) ==
........................................................ [100%]
815 passed, 6 skipped in 640.12s (0:10:40)
"""


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        ("153 passed, 1 skipped in 1500.2s", ci_record.Counts(passed=153, skipped=1)),
        ("815 passed, 6 skipped", ci_record.Counts(passed=815, skipped=6)),
        ("===== 12 passed in 3.01s =====", ci_record.Counts(passed=12)),
        (
            "2 failed, 149 passed, 1 skipped, 3 warnings, 1 error in 1610.5s (0:26:50)",
            ci_record.Counts(passed=149, skipped=1),
        ),
        ("= 1 failed, 4 deselected in 0.50s =", ci_record.Counts()),
        ("\x1b[32m\x1b[1m7 passed\x1b[0m\x1b[32m in 0.12s\x1b[0m", ci_record.Counts(passed=7)),
        ("815 passed, 6 skipped\r", ci_record.Counts(passed=815, skipped=6)),
    ],
    ids=["quiet", "no-time", "framed", "failures", "none-passed", "colour", "carriage-return"],
)
def test_a_pytest_summary_line_gives_its_passed_and_skipped(
    line: str, counts: ci_record.Counts
) -> None:
    assert ci_record.summary_counts(line) == counts


@pytest.mark.parametrize(
    "line",
    [
        "Contracts: 9 kept, 0 broken.",
        "214 files already formatted",
        "the spare test: 3 passed before the node went",
        "no tests ran in 0.01s",
        "== tests/unit and tests/worker (ran beside the above) ==",
        "12 passed, and then",
        "",
    ],
)
def test_a_line_that_is_not_a_summary_counts_nothing(line: str) -> None:
    assert ci_record.summary_counts(line) is None


def test_every_summary_line_of_make_test_is_summed() -> None:
    total = ci_record.total_counts(MAKE_TEST_LOG.splitlines())
    assert total == ci_record.Counts(passed=968, skipped=7)


def test_a_log_without_summaries_leaves_the_counts_unknown() -> None:
    assert ci_record.total_counts(["make: *** [Makefile:79: venv] Error 1"]) is None


def _record(tmp_path: Path, *, log: str, exit_code: int, cache: str = "cached") -> Path:
    (tmp_path / "make-test.log").write_text(log)
    out = tmp_path / "ci_runs.tsv"
    argv = ["--log", str(tmp_path / "make-test.log"), "--out", str(out), "--commit", "abc1234"]
    argv += ["--started", "2026-12-06T09:10:11Z", "--machine", "vm/2cpu", "--cache", cache]
    assert ci_record.main([*argv, "--seconds", "1712", "--exit-code", str(exit_code)]) == 0
    return out


def test_a_run_is_appended_under_the_header(tmp_path: Path) -> None:
    out = _record(tmp_path, log=MAKE_TEST_LOG, exit_code=0, cache="fresh")
    _record(tmp_path, log="make: *** [Makefile:79: test] Error 2\n", exit_code=2)
    lines = out.read_text().splitlines()
    assert lines == [
        "commit\tdate\tmachine\tcache\tseconds\tresult\tpassed\tskipped",
        "abc1234\t2026-12-06T09:10:11Z\tvm/2cpu\tfresh\t1712\tpassed\t968\t7",
        "abc1234\t2026-12-06T09:10:11Z\tvm/2cpu\tcached\t1712\tfailed\t-\t-",
    ]
    assert [row["result"] for row in ci_record.read(out)] == ["passed", "failed"]


def test_a_file_with_another_header_is_not_appended_to(tmp_path: Path) -> None:
    out = tmp_path / "ci_runs.tsv"
    out.write_text("commit\tseconds\nabc\t1\n")
    with pytest.raises(ValueError, match="header"):
        _record(tmp_path, log=MAKE_TEST_LOG, exit_code=0)
    assert out.read_text() == "commit\tseconds\nabc\t1\n"


def test_the_table_is_newest_first_with_readable_times() -> None:
    rows = [
        dict(zip(ci_record.COLUMNS, cells, strict=True))
        for cells in [
            ("-", "2026-12-03", "-/2cpu", "fresh", "4776", "-", "-", "-"),
            ("abc1234", "2026-12-06T09:10:11Z", "vm/2cpu", "cached", "1712", "passed", "968", "7"),
        ]
    ]
    assert ci_table.render(rows).splitlines()[2:] == [
        "| 2026-12-06 09:10:11 | `abc1234` | vm/2cpu | cached | 28 min 32 s | passed | 968 | 7 |",
        "| 2026-12-03 | - | -/2cpu | fresh | 79 min 36 s | - | - | - |",
    ]


def test_only_the_text_between_the_markers_is_replaced() -> None:
    page = f"# Page\n\nbefore\n{ci_table.BEGIN}\nold table\n{ci_table.END}\nafter\n"
    placed = ci_table.place(page, "new table")
    assert placed == f"# Page\n\nbefore\n{ci_table.BEGIN}\nnew table\n{ci_table.END}\nafter\n"
    with pytest.raises(ValueError, match="marker|line"):
        ci_table.place("# no markers\n", "new table")


def test_the_committed_page_is_what_the_results_file_renders() -> None:
    """Nobody edits the CI table by hand: `.ci/run` appends a row and renders the page."""
    want = ci_table.rendered(ci_table.PAGE, ci_record.RESULTS)
    stale = "docs/benchmarks.md's CI table is stale: run `python3 -m hack.ci_table`"
    assert ci_table.PAGE.read_text() == want, stale
    assert len(ci_record.read(ci_record.RESULTS)) >= 1
