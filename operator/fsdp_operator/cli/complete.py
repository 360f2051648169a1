"""`kubectl_complete-fsdp`: kubectl's own shell completion of `kubectl fsdp`.

fsdpctl completes itself through argcomplete (`fsdpctl completion bash`); kubectl instead runs
this executable with the words typed so far and reads its candidates. Both offer the same
commands, flags, choices and job names: both ask parser.py's parser.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

import argcomplete

from fsdp_operator.cli import parser


class _Completed(Exception):
    pass


def _stop(code: int) -> None:
    raise _Completed(code)


def kubectl_complete_main(argv: list[str] | None = None) -> int:
    """`kubectl_complete-fsdp ARG... WORD`: what kubectl's own shell completion runs for `kubectl
    fsdp ARG... WORD<TAB>` (its plugin completion protocol, kubectl >= 1.26): one candidate a
    line, then cobra's directive `:4` (complete no file names). The same candidates as fsdpctl's
    completion: commands, flags, choices and the namespace's job names."""
    words = list(sys.argv[1:] if argv is None else argv) or [""]
    line = " ".join(["kubectl-fsdp", *words])  # the last word is the one being completed
    os.environ.update(
        {
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_IFS": "\n",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
        }
    )
    for shell_specific in ("_ARGCOMPLETE_SHELL", "_ARGCOMPLETE_DFS"):
        os.environ.pop(shell_specific, None)
    out = io.StringIO()
    with contextlib.suppress(_Completed):  # argcomplete "exits" when it has answered
        argcomplete.autocomplete(
            parser.build("kubectl fsdp"), exit_method=_stop, output_stream=out, append_space=False
        )
    print("\n".join([*filter(None, out.getvalue().split("\n")), ":4"]))
    return 0
