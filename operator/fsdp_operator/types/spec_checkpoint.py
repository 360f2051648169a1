"""`spec.checkpoint` of an FSDPJob: the worker's checkpoint config plus where the checkpoints
live (a ReadWriteMany claim mounted at root, or an object store: spec_storage.py) and what
proves one complete.

Apart from api.py because where checkpoints live is its own set of rules (one place, the root a
path whatever the worker accepts, the worker's part handed on without the operator's fields).
No I/O, no clock, no kopf.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from fsdp_operator.types import spec_storage
from fsdp_operator.types.spec_rules import NAME_PATTERN, cel, rules
from fsdp_worker import contract
from fsdp_worker.contract import config_base, config_checkpoint


class CheckpointSpec(config_checkpoint.CheckpointConfig):
    """`spec.checkpoint`: the worker's checkpoint config plus where the checkpoints live (a
    claim mounted at root, or an object store) and what proves a checkpoint complete."""

    # Redeclared so the spec's root stays a path whatever the worker's config accepts: a
    # bucket is named by objectStore, whose fields the operator validates and renders.
    root: config_base.SafePath = Field(
        "/ckpt",
        description="Checkpoint directory on a shared volume (claimName's, or one the user "
        "mounts). Not used with objectStore, whose URI is the worker's root.",
    )
    completion: contract.Proof = Field(
        contract.Proof.MARKER,
        description="What proves a step-<N> checkpoint complete. Marker: the COMPLETE.json a "
        "trainer keeping docs/contract.md writes last (manifest, lineage, config hash and data "
        "cursor are checked). DCPMetadata: DCP's .metadata, as torchtitan writes its "
        "checkpoints (only its presence is checked: no manifest, lineage or config check).",
    )

    claim_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="PersistentVolumeClaim (RWX) mounted at root in every worker pod. Not "
        "with objectStore.",
    )
    object_store: spec_storage.ObjectStore | None = Field(
        None,
        description="Checkpoints in an S3-API bucket instead of on a claim: the worker's root "
        "is s3://<bucket>/<prefix>, and the pods choose their own resume point (the operator "
        "never reads the bucket). Not with claimName. Immutable.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.objectStore) || !has(self.claimName)",
                "set at most one of objectStore and claimName: checkpoints live in a bucket or"
                " on a claim",
                fieldPath=".objectStore",
            )
        )
    )

    @pydantic.model_validator(mode="after")
    def _one_place(self) -> CheckpointSpec:
        if self.object_store is not None and self.claim_name is not None:
            raise ValueError(
                f"checkpoint.objectStore (bucket {self.object_store.bucket!r}) and"
                f" checkpoint.claimName={self.claim_name!r} are both set: checkpoints live in a"
                " bucket or on a claim; set at most one"
            )
        return self

    @property
    def location(self) -> str:
        """The checkpoint root as the worker pods see it: the object store's URI, else root."""
        return self.object_store.uri if self.object_store is not None else self.root

    def worker_config(self) -> config_checkpoint.CheckpointConfig:
        exclude = {"claim_name", "completion", "object_store"}
        # An object store's URI reaches the worker as FSDP_CHECKPOINT_ROOT (the job's own
        # prefix), which overrides this root: the config's root stays a path, as its model
        # (the worker's too) requires.
        return config_checkpoint.CheckpointConfig.model_validate(
            self.model_dump(by_alias=True, exclude=exclude)
        )
