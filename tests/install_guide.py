"""What the install guide, the README and the chart's NOTES tell a user to type, as data.

Pure: the fenced shell blocks of a Markdown file (or the command lines of NOTES), each command
with its continuation lines, heredoc or piped `echo` body joined, classified by what checks it
(`Kind`), and turned into the argv that checks it: `kubectl apply ... --dry-run=server`, `helm
template`. The only substitutions are the placeholders a user must replace: the registry, the
storage class, and the namespace/chart placeholders of NOTES (`SUBSTITUTIONS`). No cluster, no
helm, no subprocess here: tests/unit/test_install_guide_parse.py checks this module;
tests/cluster/test_install_guide.py runs what it yields.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "fsdp-operator"
NOTES = CHART / "templates" / "NOTES.txt"
INSTALL = ROOT / "docs" / "install.md"
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(sh|bash|shell|console)\n(.*?)^```", re.M | re.S)
_HEREDOC = re.compile(r"\s*<<-?\s*'?(\w+)'?")
_NOTES_COMMAND = re.compile(r"^\s+(kubectl|helm|fsdpctl|echo) ")
REGISTRY_PLACEHOLDERS = ("registry.corp/ml", "registry.example.com/ml", "registry.example/ml")
STORAGE_CLASS_PLACEHOLDER = "STORAGE_CLASS"
# helm install/upgrade flags with no meaning to `helm template` (their values, if any, too)
_INSTALL_ONLY = {
    "--install": 0,
    "--reuse-values": 0,
    "--wait": 0,
    "--atomic": 0,
    "--create-namespace": 0,
    "--timeout": 1,
}


class Kind(enum.StrEnum):
    """How a command is checked."""

    FSDPCTL = "fsdpctl"  # parsed by the real CLI parser (tests/unit/test_cli_docs.py)
    APPLY = "apply"  # kubectl apply: its files exist; a server-side dry run admits them
    HELM = "helm"  # helm install/upgrade/template/show: rendered offline
    PYTHON_MODULE = "python-module"  # python -m fsdp_worker...: parsed by the module's parser
    KUBECTL = "kubectl"  # any other kubectl: its files exist; not run (it would change things)
    OTHER = "other"  # docker, pip, variables: not checked here


@dataclass(frozen=True)
class Command:
    """One command a user types: its words, and what it reads on stdin (a heredoc's body, an
    `echo`'s text, or the words of the command piped into it)."""

    doc: str
    words: tuple[str, ...]
    stdin: str | None = None
    piped_from: tuple[str, ...] | None = None

    @property
    def kind(self) -> Kind:
        return classify(self.words)

    def __str__(self) -> str:
        piped = f"{shlex.join(self.piped_from)} | " if self.piped_from else ""
        return f"{self.doc}: {piped}{shlex.join(self.words)}"


def classify(words: tuple[str, ...]) -> Kind:
    """The check a command gets, from its words alone."""
    head = words[0] if words else ""
    if head == "fsdpctl" or words[:2] == ("kubectl", "fsdp"):
        return Kind.FSDPCTL
    if head == "kubectl":
        return Kind.APPLY if "apply" in words else Kind.KUBECTL
    if head == "helm":
        return Kind.HELM
    if head in ("python", "python3") and words[1:2] == ("-m",):
        return Kind.PYTHON_MODULE
    return Kind.OTHER


def substitute(text: str, *, registry: str, storage_class: str, namespace: str = "team-a") -> str:
    """The doc's text with its placeholders filled as a user would: the registry, the storage
    class, and NOTES' TEAM (a namespace), WORKER_IMAGE (an image) and CHART (the chart)."""
    for placeholder in REGISTRY_PLACEHOLDERS:
        text = text.replace(placeholder, registry)
    text = text.replace(STORAGE_CLASS_PLACEHOLDER, storage_class)
    text = text.replace("WORKER_IMAGE", f"{registry}/fsdp-worker:0.1.0")
    text = re.sub(r"\bTEAM-GROUP\b", f"{namespace}-group", text)
    text = re.sub(r"\bTEAM\b", namespace, text)
    return re.sub(r"\bCHART\b(?= --version)", str(CHART.relative_to(ROOT)), text)


def fenced_scripts(markdown: str) -> list[str]:
    """The bodies of the shell-fenced blocks (```sh, bash, shell, console)."""
    return [body for _, body in _FENCE.findall(markdown)]


def notes_script(notes: str) -> str:
    """NOTES' command lines (indented under their prose), with a piped `echo`'s lines."""
    kept: list[str] = []
    lines = notes.splitlines()
    i = 0
    while i < len(lines):
        if _NOTES_COMMAND.match(lines[i]):
            text, i = _complete(lines, i)
            kept.append(text)
        else:
            i += 1
    return "\n".join(kept)


def commands(script: str, *, doc: str) -> list[Command]:
    """Every command of a shell script, comments dropped, pipelines split."""
    lines = script.splitlines()
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        text, i = _complete(lines, i)
        stdin = None
        if heredoc := _HEREDOC.search(text):
            text = text[: heredoc.start()] + text[heredoc.end() :]
            stdin, i = _heredoc_body(lines, i, end=heredoc.group(1))
        found.extend(_pipeline(shlex.split(text, comments=True), doc=doc, stdin=stdin))
    return found


def _complete(lines: list[str], i: int) -> tuple[str, int]:
    """Line i with its backslash continuations and the lines an open quote spans."""
    text = lines[i]
    i += 1
    while i < len(lines) and (text.endswith("\\") or not _closed(text)):
        text = text[:-1] + " " + lines[i].strip() if text.endswith("\\") else text + "\n" + lines[i]
        i += 1
    return text, i


def _closed(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation"
        return False
    return True


def _heredoc_body(lines: list[str], i: int, *, end: str) -> tuple[str, int]:
    body: list[str] = []
    while i < len(lines) and lines[i].strip() != end:
        body.append(lines[i])
        i += 1
    return "\n".join(body) + "\n", i + 1


def _pipeline(words: list[str], *, doc: str, stdin: str | None) -> Iterator[Command]:
    """`a | b`: b reads a's output (an echo's text, literally); a runs on its own too."""
    segments: list[tuple[str, ...]] = [()]
    for word in words:
        segments[-1:] = [segments[-1], ()] if word == "|" else [(*segments[-1], word)]
    previous: tuple[str, ...] | None = None
    for segment in segments:
        if previous and previous[0] == "echo":
            yield Command(doc, segment, stdin=" ".join(previous[1:]) + "\n")
        elif previous:
            yield Command(doc, segment, piped_from=previous)
        elif segment[0] != "echo":
            yield Command(doc, segment, stdin=stdin)
        previous = segment


def files_named(words: tuple[str, ...]) -> list[str]:
    """The paths a kubectl or helm command reads (-f/--filename/--values), '-' (stdin) left out."""
    named = [
        words[i + 1]
        for i, word in enumerate(words[:-1])
        if word in ("-f", "--filename", "--values")
    ]
    named += [w.split("=", 1)[1] for w in words if w.startswith(("--filename=", "--values="))]
    return [path for path in named if path != "-"]


def apply_argv(command: Command, *, namespace: str, dry_run: bool = True) -> list[str]:
    """The kubectl arguments (after `kubectl`) of an apply: the doc's own flags, files from the
    repository root, its namespace replaced by `namespace`, server-side dry run unless not."""
    words = list(command.words[1:])
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in ("-n", "--namespace"):
            skip = True
        elif word.startswith("--namespace="):
            continue
        elif i > 0 and words[i - 1] in ("-f", "--filename") and word != "-":
            out.append(str(ROOT / word))
        else:
            out.append(word)
    return [*out, "-n", namespace, *(["--dry-run=server"] if dry_run else [])]


def apply_input(
    command: Command, *, namespace: str, registry: str, storage_class: str, dry_run: bool = True
) -> tuple[list[str], str | None]:
    """The argv and stdin of an apply with the example files' placeholders filled like the
    doc's own text: the files (a directory: its *.yaml) go in on stdin, substituted. A command
    reading stdin gets its heredoc or echo body; one piped into gets None (the caller runs
    `piped_from`)."""
    named = files_named(command.words)
    argv = apply_argv(command, namespace=namespace, dry_run=dry_run)
    if not named:
        return argv, command.stdin
    paths = [ROOT / name for name in named]
    files = [f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]
    text = "\n---\n".join(f.read_text() for f in files)
    kept = _drop_file_flags(argv, {str(p) for p in paths})
    return [*kept, "-f", "-"], substitute(text, registry=registry, storage_class=storage_class)


def _drop_file_flags(argv: list[str], resolved: set[str]) -> list[str]:
    """argv without each `-f PATH` / `--filename PATH` pair whose PATH is in `resolved`."""
    out: list[str] = []
    for i, word in enumerate(argv):
        following = argv[i + 1] if i + 1 < len(argv) else ""
        if word in resolved or (word in ("-f", "--filename") and following in resolved):
            continue
        out.append(word)
    return out


def helm_template_argv(words: tuple[str, ...]) -> list[str] | None:
    """The `helm` arguments that render what an install or upgrade would apply (`template`,
    install-only flags dropped), `helm show`/`template` as written; None for other verbs
    (uninstall, repo, ...), which change a cluster and render nothing."""
    verb = words[1] if len(words) > 1 else ""
    if verb in ("show", "template"):
        return list(words[1:])
    if verb not in ("install", "upgrade"):
        return None
    out: list[str] = ["template"]
    rest = list(words[2:])
    while rest:
        word = rest.pop(0)
        if word in _INSTALL_ONLY:
            del rest[: _INSTALL_ONLY[word]]
        else:
            out.append(word)
    return out


def guide_commands(*, registry: str, storage_class: str, notes: str | None = None) -> list[Command]:
    """Every command of docs/install.md and the README, and of NOTES (`notes`: its rendered
    text, else the template itself), placeholders substituted."""

    def fill(text: str) -> str:
        return substitute(text, registry=registry, storage_class=storage_class)

    found: list[Command] = []
    for doc in (INSTALL, README):
        for script in fenced_scripts(fill(doc.read_text())):
            found += commands(script, doc=doc.name)
    notes_text = fill(notes if notes is not None else NOTES.read_text())
    return found + commands(notes_script(notes_text), doc=NOTES.name)
