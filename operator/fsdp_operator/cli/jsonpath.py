"""kubectl's JSONPath templates, for `-o jsonpath=...`, `-o custom-columns=...` and `wait --for`.

The subset scripts use with kubectl: literal text, `{.a.b}`, `{.a[0]}`, `{.a[-1]}`, `{.a[*]}`,
`{.a[1:3]}`, filters `{.a[?(@.type=="Ready")].status}`, escaped dots in keys
(`{.metadata.labels.app\\.kubernetes\\.io/name}`), quoted literals (`{"\\n"}`) and
`{range .items[*]}...{end}`. A missing key prints nothing, as `kubectl get -o jsonpath` does.
Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TOKEN = re.compile(r"""\{((?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^}])*)\}""")
_STEP = re.compile(
    r"""\.((?:[^.\[\\]|\\.)+)|\[\?\(@((?:\.[\w-]+)+)\s*(==|!=)\s*(?:"([^"]*)"|'([^']*)'|([^)\]]*))\)\]|\[([^\]]*)\]"""
)


class TemplateError(ValueError):
    """A template this parser cannot read: the message names the part it stopped at."""


def _literal(quoted: str) -> str:
    """`"\\n"` -> a newline: the quoted text of a `{"..."}` action."""
    inner = re.sub(r'(?<!\\)"', r'\\"', quoted[1:-1])  # a `"` inside '...' is plain text
    return str(json.loads(f'"{inner}"'))


def _index(nodes: list[Any], spec: str) -> list[Any]:
    """`[*]`, `[2]`, `[-1]`, `[0:2]` over the lists among `nodes` (other nodes drop out)."""
    out: list[Any] = []
    for node in nodes:
        if not isinstance(node, list):
            continue
        if spec == "*":
            out += node
        elif ":" in spec:
            start, _, stop = spec.partition(":")
            out += node[_int(start) if start else None : _int(stop) if stop else None]
        elif -len(node) <= _int(spec) < len(node):
            out.append(node[int(spec)])
    return out


def _int(spec: str) -> int:
    try:
        return int(spec)
    except ValueError:
        raise TemplateError(f"[{spec}]: an index is a number, [*] or [start:stop]") from None


def _field(nodes: list[Any], key: str) -> list[Any]:
    """`.key` (or `.*`) of the maps among `nodes`; a missing key yields nothing."""
    key = key.replace("\\.", ".")
    out: list[Any] = []
    for node in nodes:
        if isinstance(node, dict):
            if key == "*":
                out += node.values()
            elif key in node:
                out.append(node[key])
        elif isinstance(node, list) and key == "*":
            out += node
    return out


def _filter(nodes: list[Any], path: str, op: str, want: str) -> list[Any]:
    """`[?(@.path=="value")]`: the list items whose `path` prints as `value` (or not)."""
    kept = []
    for item in _index(nodes, "*"):
        got = [text(v) for v in evaluate(item, path)]
        if (want in got) == (op == "=="):
            kept.append(item)
    return kept


def evaluate(root: Any, path: str) -> list[Any]:
    """Every value `path` (`.a.b[*].c`, or `.`/`@`/`$` for the root) selects in `root`."""
    path = path.strip()
    if path in (".", "@", "$", ""):
        return [root]
    path = path.removeprefix("$").removeprefix("@")
    nodes, at = [root], 0
    while at < len(path):
        step = _STEP.match(path, at)
        if step is None:
            raise TemplateError(f"cannot read {path[at:]!r} in {path!r}")
        key, fpath, op, dq, sq, bare, index = step.groups()
        if key is not None:
            nodes = _field(nodes, key)
        elif fpath is not None:
            want = dq if dq is not None else sq if sq is not None else (bare or "").strip()
            nodes = _filter(nodes, fpath, op, want)
        else:
            nodes = _index(nodes, index.strip())
        at = step.end()
    return nodes


def text(value: Any) -> str:
    """A value as kubectl prints it: strings bare, maps and lists as JSON, true/false."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else str(value)


def _actions(template: str) -> list[tuple[str, str]]:
    """The template as ("text", literal) and ("action", inside-the-braces) parts."""
    if "{" not in template:  # kubectl's relaxed form: `.status.phase` means `{.status.phase}`
        template = "{" + template + "}"
    parts, at = [], 0
    for match in _TOKEN.finditer(template):
        if match.start() > at:
            parts.append(("text", template[at : match.start()]))
        parts.append(("action", match.group(1).strip()))
        at = match.end()
    if at < len(template):
        parts.append(("text", template[at:]))
    return parts


def render(template: str, root: Any) -> str:
    """The template filled from `root`, as `kubectl get -o jsonpath=TEMPLATE` prints it."""
    out, _ = _run(_actions(template), 0, root)
    return out


def _run(parts: list[tuple[str, str]], at: int, node: Any) -> tuple[str, int]:
    """Renders parts from `at` over `node` up to a matching `{end}` (or the end); returns the
    text and the index after it."""
    out: list[str] = []
    while at < len(parts):
        kind, body = parts[at]
        at += 1
        if kind == "text":
            out.append(body)
        elif body == "end":
            return "".join(out), at
        elif body.startswith("range "):
            items, after = evaluate(node, body[len("range ") :]), at
            for item in items:
                chunk, after = _run(parts, at, item)
                out.append(chunk)
            at = after if items else _skip_range(parts, at)
        elif body[:1] in ("'", '"'):
            out.append(_literal(body))
        else:
            out.append(" ".join(text(v) for v in evaluate(node, body)))
    return "".join(out), at


def _skip_range(parts: list[tuple[str, str]], at: int) -> int:
    """The index after the `{end}` that closes the range whose body starts at `at`."""
    depth = 1
    while at < len(parts) and depth:
        kind, body = parts[at]
        if kind == "action":
            depth += body.startswith("range ") - (body == "end")
        at += 1
    if depth:
        raise TemplateError("a {range} has no {end}")
    return at
