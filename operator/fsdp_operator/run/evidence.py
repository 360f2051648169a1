"""A failed attempt's evidence, read before its pods are deleted and kept after them.

`kubectl logs` cannot read a deleted pod, and a restart that deletes a hung gang erases which
rank stopped where. So before the teardown decide() asked for (decide.Collect), this reads
each pod's log tail through the API server (pods/log: no exec, no ingress into the tenant's
network), finds the ranks' FSDP_EVIDENCE records in it, compares them (explain.py) and keeps
the tails and the comparison in one ConfigMap per failed attempt, owned by the job (deleted
with it; never another job's). The newest explain.EVIDENCE_ATTEMPTS are kept.

Advice, never a reason to stop: a log that cannot be read is said so, and a failed write of
the ConfigMap leaves the failure as detected.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from typing import Any

from fsdp_operator.io import kube, metrics, reports
from fsdp_operator.policy import decide, explain
from fsdp_operator.render import templates
from fsdp_operator.types import names, status

log = logging.getLogger(__name__)


def _tails(
    api: kube.Kube,
    namespace: str,
    collect: decide.Collect,
    pool: concurrent.futures.Executor,
) -> dict[int, str | None]:
    share = explain.log_share(len(collect.pods))

    def tail(pod: tuple[int, str, str | None]) -> tuple[int, str | None]:
        if pod[0] in collect.unreadable:
            return pod[0], None
        try:
            text = api.pod_log_tail(namespace, pod[1], lines=explain.LOG_TAIL_LINES, limit=share)
        except Exception as exc:  # one unreadable log must not hide the others
            log.warning("log of %s/%s not read: %s", namespace, pod[1], kube.describe_error(exc))
            text = None
        return pod[0], text

    return dict(pool.map(tail, collect.pods))


def _records(
    tails: dict[int, str | None], collect: decide.Collect
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """Each rank's evidence (only ranks of the pod whose log it is), and the table kept."""
    found: dict[int, dict[str, Any]] = {}
    for pod, text in tails.items():
        ranks = range(pod * collect.nproc_per_node, (pod + 1) * collect.nproc_per_node)
        for rank, doc in reports.evidence_lines(text or "").items():
            if rank in ranks:
                found[rank] = {**doc, "pod": pod}
    table = [
        found.get(r) or {"rank": r, "pod": r // collect.nproc_per_node, "evidence": False}
        for r in range(collect.world_size)
    ]
    return found, table


def explained(
    failure: status.Failure, collect: decide.Collect, found: dict[int, dict[str, Any]]
) -> status.Failure:
    """The failure with the ranks' evidence compared (a hang names its odd rank out)."""
    update: dict[str, Any] = {}
    if collect.hang:
        report = explain.compare_hang(found, collect.world_size)
        update["evidence"] = report.summary
        if diagnosis := explain.hang_diagnosis(report, found):
            update["diagnosis"] = diagnosis
        odd_pods = {r // collect.nproc_per_node for r in report.odd_ranks}
        if len(odd_pods) == 1:  # one pod is not where the others are: it is the failing one
            pod = odd_pods.pop()
            first = found.get(min(report.odd_ranks))
            _, name, node = next((p for p in collect.pods if p[0] == pod), (pod, None, None))
            update.update(rank=pod, pod=name, node=node)
            if first is not None:
                update["phase"] = first.get("where")
                update["step"] = first.get("step")
    elif found:
        update["evidence"] = "; ".join(
            f"rank {r}: {explain.Situation.of(doc).words()}" for r, doc in sorted(found.items())
        )[: explain.SUMMARY_MAX]
    return failure.model_copy(update=update)


def config_map(
    job: names.JobRef,
    collect: decide.Collect,
    failure: status.Failure,
    tails: dict[int, str | None],
    table: list[dict[str, Any]],
) -> dict[str, Any]:
    first = failure.rank if failure.pod else None
    doc = {
        **failure.model_dump(mode="json", by_alias=True),
        "nprocPerNode": collect.nproc_per_node,
        "firstPod": first,
    }
    data = {
        "summary.txt": "\n".join(
            part
            for part in (
                f"attempt {collect.attempt}: {failure.cause.value}: {failure.message}",
                failure.diagnosis,
                failure.evidence,
            )
            if part
        ),
        "failure.json": json.dumps(doc, indent=1),
        "ranks.json": explain.json_within(table, explain.CONFIGMAP_BUDGET // 8),
    }
    failing = [] if failure.rank is None else [failure.rank]
    silent = [r["pod"] for r in table if r.get("evidence") is False] if collect.hang else []
    share = explain.log_share(len(collect.pods))
    for pod in explain.pods_to_keep(sorted(tails), [*failing, *silent]):
        text = tails[pod]
        # Redacted before it is kept (the ConfigMap outlives the pods; the namespace's readers
        # see it), then bounded as the text it is: a tail cut by bytes and decoded with
        # replacement can be three times its bytes.
        kept = explain.bounded(explain.redact(text), share) if text is not None else None
        data[f"log-{pod}.txt"] = kept if kept is not None else "(the log could not be read)\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.evidence_name(job.name, attempt=collect.attempt),
            "namespace": job.namespace,
            "labels": names.attempt_selector_labels(job.name, attempt=collect.attempt),
            "ownerReferences": [templates.owner_reference(job)],
        },
        "data": data,
    }


def collect_and_keep(
    api: kube.Kube,
    job: names.JobRef,
    collect: decide.Collect,
    failure: status.Failure,
    pool: concurrent.futures.Executor,
) -> status.Failure:
    """Read, compare, keep; returns the failure as status should say it."""
    began = time.monotonic()
    tails = _tails(api, job.namespace, collect, pool)
    found, table = _records(tails, collect)
    better = explained(failure, collect, found)
    name = names.evidence_name(job.name, attempt=collect.attempt)
    try:
        if api.put_config_map(config_map(job, collect, better, tails, table), owner_uid=job.uid):
            better = better.model_copy(update={"evidence_ref": name})
        else:
            log.warning(
                "evidence of %s/%s not kept: that ConfigMap is not the job's", job.namespace, name
            )
    except kube.NotLeader:
        raise
    except Exception as exc:
        log.warning("evidence of %s/%s not kept: %s", job.namespace, name, kube.describe_error(exc))
    for attempt in collect.drop:
        name = names.evidence_name(job.name, attempt=attempt)
        api.delete_config_map(job.namespace, name, owner_uid=job.uid)
    took = time.monotonic() - began
    metrics.EVIDENCE.observe(took)
    log.info(
        "evidence of %s/%s attempt %d kept in %.2fs", job.namespace, job.name, collect.attempt, took
    )
    return better
