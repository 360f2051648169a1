"""The install guide's commands as a user would copy them (tests/install_guide.py): extracted
from the fenced blocks and NOTES, classified, substituted, and turned into the dry runs and
renders tests/cluster/test_install_guide.py runs. What needs no cluster is checked here: every
file a command names exists, every data-prep command parses, and the fsdpctl commands found
are the ones tests/unit/test_cli_docs.py parses."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fsdp_worker.train import prepare
from tests import install_guide as guide
from tests.install_guide import Kind

REGISTRY, CLASS = "localhost:5000/ml", "local-dir"
COMMANDS = guide.guide_commands(registry=REGISTRY, storage_class=CLASS)


def _one(script: str) -> guide.Command:
    (command,) = guide.commands(script, doc="t")
    return command


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("fsdpctl -n a describe x", Kind.FSDPCTL),
        ("kubectl fsdp describe x -n a", Kind.FSDPCTL),
        ("kubectl -n a apply -f x.yaml", Kind.APPLY),
        ("kubectl apply --server-side -f crds/", Kind.APPLY),
        ("kubectl -n a get fsdpj", Kind.KUBECTL),
        ("kubectl delete -f crds/", Kind.KUBECTL),
        ("helm upgrade --install r c", Kind.HELM),
        ("python -m fsdp_worker.train.prepare --corpus c", Kind.PYTHON_MODULE),
        ("docker push r/x:1", Kind.OTHER),
        ("pip install '.[prep]'", Kind.OTHER),
    ],
)
def test_classify(line: str, kind: Kind) -> None:
    assert guide.classify(tuple(shlex.split(line))) is kind


def test_continuations_comments_and_heredocs_make_one_command_each() -> None:
    script = (
        "# a comment line\n"
        "helm install r charts/x -n ns \\\n"
        "  --set a=b   # the chart's trailing comment\n"
        "\n"
        "kubectl -n team-a apply -f - <<'EOF'\n"
        "kind: A\n"
        "---\n"
        "kind: B\n"
        "EOF\n"
        "kubectl get a\n"
    )
    helm, apply, get = guide.commands(script, doc="t")
    assert helm.words == ("helm", "install", "r", "charts/x", "-n", "ns", "--set", "a=b")
    assert apply.words == ("kubectl", "-n", "team-a", "apply", "-f", "-")
    assert apply.stdin == "kind: A\n---\nkind: B\n"
    assert get.words == ("kubectl", "get", "a") and get.stdin is None


def test_a_piped_echo_is_the_stdin_and_a_piped_command_is_named() -> None:
    echo = _one("  echo '\n  kind: A\n  spec: {}\n  ' | kubectl -n t apply -f -")
    assert echo.words[-3:] == ("apply", "-f", "-")
    assert echo.stdin is not None and "kind: A" in echo.stdin
    show, apply = guide.commands("helm show crds c | kubectl apply --server-side -f -", doc="t")
    assert show.piped_from is None and apply.piped_from == ("helm", "show", "crds", "c")


def test_notes_keeps_only_its_indented_commands() -> None:
    notes = "Prose with kubectl in it.\n  kubectl -n x get lease y\nMore prose:\n  fsdpctl get\n"
    script = guide.notes_script(notes)
    assert script.splitlines() == ["  kubectl -n x get lease y", "  fsdpctl get"]


def test_substitute_fills_only_the_placeholders() -> None:
    text = (
        "registry.corp/ml/fsdp-operator registry.example/ml/x storageClassName: STORAGE_CLASS "
        "-n TEAM --group=TEAM-GROUP image: WORKER_IMAGE helm show crds CHART --version V "
        "TEAMS CHARTS"
    )
    assert guide.substitute(text, registry="r.local/ml", storage_class="nfs") == (
        "r.local/ml/fsdp-operator r.local/ml/x storageClassName: nfs "
        "-n team-a --group=team-a-group image: r.local/ml/fsdp-worker:0.1.0 "
        "helm show crds charts/fsdp-operator --version V TEAMS CHARTS"
    )


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        (
            "helm install r charts/c -n ns --create-namespace --set a=b --wait --timeout 5m",
            "template r charts/c -n ns --set a=b",
        ),
        (
            "helm upgrade --install r charts/c -n ns --reuse-values -f v.yaml",
            "template r charts/c -n ns -f v.yaml",
        ),
        ("helm show crds charts/c --version 2", "show crds charts/c --version 2"),
        ("helm uninstall r -n ns", None),
    ],
)
def test_helm_template_argv(line: str, argv: str | None) -> None:
    got = guide.helm_template_argv(tuple(shlex.split(line)))
    assert got == (argv.split() if argv else None)


def test_apply_argv_resolves_files_and_replaces_the_namespace() -> None:
    command = _one("kubectl -n team-a apply -f examples/x.yaml --server-side")
    assert guide.apply_argv(command, namespace="t1") == [
        "apply",
        "-f",
        str(guide.ROOT / "examples" / "x.yaml"),
        "--server-side",
        "-n",
        "t1",
        "--dry-run=server",
    ]
    stdin = _one("kubectl apply -f - <<'EOF'\nkind: A\nEOF")
    assert guide.apply_argv(stdin, namespace="t1", dry_run=False) == [
        "apply",
        "-f",
        "-",
        "-n",
        "t1",
    ]


def test_the_guide_has_each_kind_of_check() -> None:
    kinds = {c.kind for c in COMMANDS}
    assert kinds >= {Kind.APPLY, Kind.HELM, Kind.FSDPCTL, Kind.PYTHON_MODULE}
    docs = {c.doc for c in COMMANDS if c.kind is Kind.APPLY}
    assert docs == {"install.md", "README.md", "NOTES.txt"}


@pytest.mark.parametrize("command", [c for c in COMMANDS if guide.files_named(c.words)], ids=str)
def test_every_file_a_command_names_exists(command: guide.Command) -> None:
    for path in guide.files_named(command.words):
        assert (guide.ROOT / path).exists(), f"{command}: {path} does not exist"


def test_no_placeholder_is_left_once_substituted() -> None:
    for command in COMMANDS:
        text = f"{command} {command.stdin or ''}"
        for placeholder in ("STORAGE_CLASS", "WORKER_IMAGE", "registry.corp", " TEAM "):
            assert placeholder not in text, f"{command}: {placeholder}"
    for path in (guide.ROOT / "examples").glob("*.yaml"):
        text = guide.substitute(path.read_text(), registry=REGISTRY, storage_class=CLASS)
        assert "STORAGE_CLASS" not in text, path


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind is Kind.PYTHON_MODULE], ids=str)
def test_each_data_prep_command_parses(command: guide.Command) -> None:
    assert command.words[:3] == ("python", "-m", "fsdp_worker.train.prepare")
    args = prepare._parser().parse_args(list(command.words[3:]))
    assert args.corpus == Path("corpus.txt") and args.out == Path("tokens.bin")


def test_the_fsdpctl_commands_are_those_test_cli_docs_parses() -> None:
    """Reuse, not a second parser check: the same commands, file by file."""
    from tests.unit import test_cli_docs

    ours = sorted(c.doc for c in COMMANDS if c.kind is Kind.FSDPCTL)
    theirs = sorted(doc for doc, _ in test_cli_docs.COMMANDS)
    assert ours == theirs


def test_apply_input_sends_example_files_substituted_on_stdin() -> None:
    command = _one("kubectl -n team-a apply -f examples/pvc-ckpt.yaml")
    argv, stdin = guide.apply_input(command, namespace="t1", registry=REGISTRY, storage_class=CLASS)
    assert argv == ["apply", "-n", "t1", "--dry-run=server", "-f", "-"]
    assert stdin is not None and f"storageClassName: {CLASS}" in stdin
    crds = _one("kubectl apply --server-side -f charts/fsdp-operator/crds/")
    argv, stdin = guide.apply_input(crds, namespace="t1", registry=REGISTRY, storage_class=CLASS)
    assert argv[:2] == ["apply", "--server-side"] and argv[-2:] == ["-f", "-"]
    assert stdin is not None and stdin.count("kind: CustomResourceDefinition") == 2
    heredoc = _one("kubectl apply -f - <<'EOF'\nkind: A\nEOF")
    assert guide.apply_input(heredoc, namespace="t1", registry=REGISTRY, storage_class=CLASS)[
        1
    ] == ("kind: A\n")
