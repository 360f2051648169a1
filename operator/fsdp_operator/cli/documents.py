"""The operator's documents as fsdpctl reads them: through the operator's own models, as written.

The status is parsed once, by `types.status`'s models, so the views read typed attributes and
never a camelCase key. But a command-line tool must show what another version of the operator
wrote, so each model is read as written (`as_written`): a field the document does not say is
None (not the model's default: a job the operator has not written yet shows `-`, not Pending),
a field the model does not know is ignored (a newer operator), and a state or cause the enum does
not know is kept as its string. Parsing only: no I/O, no rendering.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import pydantic

from fsdp_operator.types import api, status

Model = TypeVar("Model", bound=pydantic.BaseModel)


def as_written(model: type[Model]) -> type[Model]:
    """`model` read as written: a subclass whose every field is optional (None when absent),
    whose nested models are read as written too, that ignores unknown fields and keeps unknown
    enum values as strings. Its type says `model`; read every attribute as possibly None."""
    return typing.cast(type[Model], _subclass(model))


@functools.cache  # one class per model: pydantic builds each validator once
def _subclass(model: type[pydantic.BaseModel]) -> type[pydantic.BaseModel]:
    fields = {name: _optional(info) for name, info in model.model_fields.items()}
    namespace: dict[str, Any] = {
        "__annotations__": fields,
        "__module__": __name__,
        "__qualname__": model.__qualname__,
        "__doc__": model.__doc__,
        "model_config": pydantic.ConfigDict(extra="ignore"),
        **dict.fromkeys(fields),
    }
    return type(model.__name__, (model,), namespace)


def _optional(info: pydantic.fields.FieldInfo) -> Any:
    """A field's type, optional, with its validators kept (a Time still parses RFC 3339)."""
    return _annotated(_tolerant(info.annotation) | None, info.metadata)


def _tolerant(annotation: Any) -> Any:
    """`annotation` with each model read as written and each enum open to unknown values."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return as_written(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return Annotated[annotation | str, pydantic.Field(union_mode="left_to_right")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _annotated(_tolerant(args[0]), annotation.__metadata__)
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_tolerant(arg) for arg in args)]  # noqa: UP007
    if origin in (list, dict):
        return types.GenericAlias(origin, tuple(_tolerant(arg) for arg in args))
    return annotation


def _annotated(annotation: Any, metadata: typing.Sequence[Any]) -> Any:
    return Annotated[(annotation, *metadata)] if metadata else annotation


def job_status(job: Mapping[str, Any]) -> status.FSDPJobStatus:
    """An FSDPJob's status as written (every field None where it says nothing)."""
    return as_written(status.FSDPJobStatus).model_validate(job.get("status") or {})


class _SpecRead(pydantic.BaseModel):
    """The spec fields fsdpctl reads, under the spec model's names; the rest is ignored (a spec
    is not validated here: that is the API server's and the operator's work)."""

    model_config = pydantic.ConfigDict(alias_generator=pydantic.alias_generators.to_camel)

    nproc_per_node: int | None = None


def nproc_per_node(job: Mapping[str, Any]) -> int:
    """spec.nprocPerNode, or its default where the spec does not say it."""
    said = _SpecRead.model_validate(job.get("spec") or {}).nproc_per_node
    default: int = api.FSDPJobSpec.model_fields["nproc_per_node"].default
    return said or default


class KeptFailure(status.Failure):
    """failure.json in a failed attempt's evidence ConfigMap (run/evidence.py writes it): the
    attempt's Failure, plus what `fsdpctl logs` needs to name each pod's ranks."""

    nproc_per_node: int | None = None
    first_pod: int | None = pydantic.Field(None, description="The pod whose error came first.")


def kept_failure(text: str | None) -> KeptFailure:
    """An evidence ConfigMap's failure.json, as written; `{}` where it keeps none."""
    return as_written(KeptFailure).model_validate_json(text or "{}")
