"""The built-in trainer's torchrun entrypoint: build, resume, train. It is one user of the
trainer kit (kit.py), which reads the config and environment, joins the gang, and exits with a
documented code (contract.ExitCode), leaving a JSON termination message on failure.

This module wires the others together; it must not contain training, checkpoint or data logic
of its own.
"""

from __future__ import annotations

import json
import logging

import torch

from fsdp_worker import kit
from fsdp_worker.checkpointing import resume, state
from fsdp_worker.contract import batch, config
from fsdp_worker.runtime import distributed
from fsdp_worker.telemetry import flight, pace
from fsdp_worker.train import data, ledger, model, optim, parallelize, preflight, trainer

log = logging.getLogger("fsdp_worker")


def _build_state(tcfg: config.TrainingConfig, di: distributed.DistInfo) -> state.TrainState:
    """Model (sharded, initialised), optimizer and schedule; rank 0 logs the state ledger."""
    net = model.build(tcfg)
    template = model.meta_template(net, factory=tcfg.model.factory)
    parallelize.shard(net, mesh=di.mesh, precision=tcfg.precision, ac=tcfg.activation_checkpointing)
    model.materialize(net, device=di.device, seed=tcfg.seed, template=template)
    flight.watch_blocks(net)
    opt = optim.build_optimizer(net, tcfg.optimizer)
    dtype = parallelize.mp_policy(tcfg.precision).param_dtype or torch.float32
    planned = ledger.planned(net, param_dtype=dtype, world_size=di.world_size)
    recorder = flight.current()
    if recorder is not None:  # an OOM's allocator view is read against the plan
        recorder.note_ledger(planned)
    if di.rank == 0:
        log.info("ledger %s", json.dumps(planned))
    return state.TrainState(net, opt, optim.build_scheduler(opt, cfg=tcfg))


def _train(run: kit.Run) -> None:
    tcfg, di = run.config.training, run.dist
    torch.manual_seed(tcfg.seed)
    plan = batch.make_plan(tcfg, world_size=di.world_size, rank=di.rank)
    source = data.make_source(tcfg)
    run.tracked = st = _build_state(tcfg, di)
    point = run.load(run.choose(), lambda p: resume.load(p, st, dist_info=di, seed=tcfg.seed))
    run.opened(point, start_step=st.step)
    assert run.manager is not None and run.schedule is not None
    loop = trainer.Loop(
        cfg=tcfg,
        schedule=run.schedule,
        st=st,
        source=source,
        plan=plan,
        ckpt=run.manager,
        meters=run.meters,
        dist=di,
        stop_requested=run.stop_requested,
        pace=pace.Pace(world_size=di.world_size, device=di.device),
        save_memory=lambda step, claimed, steps_run, step_seconds: run.save_memory_if_due(
            step,
            samples=st.samples,
            make_state=lambda: state.to_save(st, group=di.ckpt_group),
            claimed=claimed,
            totals=(steps_run, step_seconds),
        ),
    )
    trainer.run(loop)
    run.export(st.model)


def main() -> int:
    return kit.main(_train, before_rendezvous=preflight.check_plan)
