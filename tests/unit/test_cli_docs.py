"""What the chart's NOTES, the README and the install guide tell a user to type works as written:
each `fsdpctl`/`kubectl fsdp` command parses with the real CLI parser, the job NOTES prints is a
valid FSDPJob, NOTES names every CRD the chart installs, and no file a chart user lacks."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from fsdp_operator.cli import parser
from fsdp_operator.types import api

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "fsdp-operator"
NOTES = CHART / "templates" / "NOTES.txt"
DOCS = (NOTES, ROOT / "README.md", ROOT / "docs" / "install.md")
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
_COMMAND = re.compile(r"^\s*(?:\$ )?((?:fsdpctl|kubectl fsdp)(?: .*)?)$")


def _code_lines(doc: Path) -> list[str]:
    """The lines a user copies: fenced blocks in Markdown, every line of NOTES."""
    text = doc.read_text()
    if doc.suffix == ".md":
        return [line for block in _FENCE.findall(text) for line in block.splitlines()]
    return text.splitlines()


def _commands() -> list[tuple[str, str]]:
    """(file, command) for each line that runs fsdpctl, its shell comment dropped."""
    found = []
    for doc in DOCS:
        for line in _code_lines(doc):
            if match := _COMMAND.match(line):
                words = shlex.split(match.group(1), comments=True)
                found.append((doc.name, shlex.join(words)))
    return found


COMMANDS = _commands()


def test_the_docs_show_fsdpctl_in_each_file() -> None:
    assert {doc for doc, _ in COMMANDS} == {d.name for d in DOCS}


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}: {c}" for d, c in COMMANDS])
def test_each_fsdpctl_command_in_the_docs_parses(doc: str, command: str) -> None:
    words = shlex.split(command)
    prog = "kubectl fsdp" if words[0] == "kubectl" else "fsdpctl"
    argv = words[2:] if words[0] == "kubectl" else words[1:]
    try:
        parser.build(prog).parse_args(argv)
    except SystemExit as exited:  # argparse's way to refuse (or to print --help)
        pytest.fail(f"{doc}: `{command}` does not parse (exit {exited.code})")


def test_the_job_notes_prints_is_a_valid_fsdpjob() -> None:
    block = NOTES.read_text().split("echo '\n", 1)[1].split("' | kubectl", 1)[0]
    job = yaml.safe_load(block)
    assert (job["apiVersion"], job["kind"]) == (f"{api.GROUP}/{api.VERSION}", api.KIND)
    api.FSDPJobSpec.model_validate(job["spec"])


def test_notes_names_every_crd_the_chart_installs_and_upgrades_them_all() -> None:
    notes = NOTES.read_text()
    kinds = [yaml.safe_load(p.read_text())["spec"]["names"]["kind"] for p in CHART.glob("crds/*")]
    assert sorted(kinds) == ["FSDPJob", "FSDPRuntimeProfile"]
    for kind in kinds:
        assert kind in notes.split("CRDs", 1)[1], f"the upgrade instructions do not name {kind}"
    assert "helm show crds" in notes  # every CRD in the chart, from the chart a user has


def test_notes_points_at_no_file_the_chart_does_not_ship() -> None:
    """A user who installed from a chart tarball has the chart, not the repository."""
    notes = NOTES.read_text()
    for named in re.findall(r"(?<![\w/:.])([\w.-]+/)*[\w-]+\.(?:ya?ml|md|json|py)\b", notes):
        pytest.fail(f"NOTES names a file: {named!r}")
    for path in re.findall(r"(?<![\w/:.])((?:[\w-]+/)+)(?=\s|\)|$)", notes):
        assert (CHART / path).is_dir(), f"NOTES names {path}, which the chart does not have"
