"""`spec.trainer` of an FSDPJob: the team's own training code (a module or a script in the
image) and its arguments, with the `$(NAME)` references Kubernetes expands in them.

Apart from api.py because a trainer's entry and its arguments have rules of their own: exactly
one entry, and only the variables docs/contract.md lists may be referenced (arg_parts reads an
argument as Kubernetes does; render/worker_container.py escapes the rest). No I/O, no clock, no
kopf.
"""

from __future__ import annotations

import re
from typing import Annotated

import pydantic
from pydantic import Field

from fsdp_operator.types.spec_rules import SpecModel, cel, rules
from fsdp_worker import contract

MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
SCRIPT_PATTERN = r"^/[A-Za-z0-9._/+-]*[A-Za-z0-9_+-]$"
_ARG_REFERENCE = re.compile(r"\(([A-Za-z_][A-Za-z0-9_]*)\)")


def arg_parts(arg: str) -> list[tuple[str, bool]]:
    """A trainer argument as Kubernetes reads it: literal text and `$(NAME)` references, as
    (text, is_reference) pairs; `$$` is a literal `$`, as in a container's args."""
    parts: list[tuple[str, bool]] = []
    literal, i = "", 0
    while i < len(arg):
        ref = _ARG_REFERENCE.match(arg, i + 1) if arg[i] == "$" else None
        if arg.startswith("$$", i):
            literal, i = literal + "$", i + 2
        elif ref is not None:
            parts += [(literal, False), (ref.group(1), True)]
            literal, i = "", ref.end()
        else:
            literal, i = literal + arg[i], i + 1
    return [p for p in [*parts, (literal, False)] if p[0]]


class Trainer(SpecModel):
    """`spec.trainer`: the team's own training code, in `spec.image`, started by the operator's
    torchrun (rendezvous, ranks, restarts and environment stay the operator's: see
    docs/contract.md). Without it every rank runs the built-in trainer."""

    module: str | None = Field(
        None,
        pattern=MODULE_PATTERN,
        max_length=256,
        description="Python module each rank runs (`torchrun -m <module>`), e.g. team.train.",
    )
    script: str | None = Field(
        None,
        pattern=SCRIPT_PATTERN,
        max_length=1024,
        description="Or an absolute path of a Python script in the image (`torchrun <script>`).",
        json_schema_extra=rules(cel("!self.contains('/../')", "script must not contain /../")),
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments after the module or script, passed as a list (no shell). "
        "$(FSDP_CHECKPOINT_ROOT) and the other variables docs/contract.md lists for arguments "
        "are expanded; every other $ reaches the trainer as written.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel("has(self.module) != has(self.script)", "set exactly one of module and script")
        )
    )

    @pydantic.model_validator(mode="after")
    def _one_entry(self) -> Trainer:
        if (self.module is None) == (self.script is None):
            raise ValueError(
                f"trainer: set exactly one of module and script (got module={self.module!r},"
                f" script={self.script!r})"
            )
        if self.script is not None and "/../" in self.script:
            raise ValueError(f"trainer.script {self.script!r} must not contain /../")
        for index, arg in enumerate(self.args):
            refs = [text for text, is_ref in arg_parts(arg) if is_ref]
            unknown = [n for n in refs if n not in contract.ARG_VARIABLES]
            if unknown:
                raise ValueError(
                    f"trainer.args[{index}]={arg!r} references $({unknown[0]}); arguments may"
                    f" reference only {', '.join(contract.ARG_VARIABLES)} (write $$( for a"
                    " literal $()"
                )
        return self
