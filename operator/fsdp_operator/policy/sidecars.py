"""The team's sidecars: their restarts are told (a condition, and an Event when the count
grows), never judged as a rank's failure.

A native sidecar (restartPolicy Always) restarts in place and the pod's phase ignores it, and
observe.py reads a rank's failure only from the worker container; this policy is where what
the sidecars do reaches the user. Pure: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

from fsdp_operator.policy import conditions, decision
from fsdp_operator.types import observed

SIDECARS = "SidecarsRestarted"
"""The condition: True while a sidecar of the current attempt's pods has restarted."""


def told(d: decision.Draft, obs: observed.Observed) -> None:
    """Set the condition from the attempt's pods; a Warning Event SidecarRestarted whenever
    the restarts counted grow (the condition's message is this policy's memory)."""
    restarted = [(pod, car) for pod in obs.attempt_pods(d.status.attempt) for car in pod.sidecars]
    old = next((c for c in d.status.conditions if c.type == SIDECARS), None)
    if not restarted:
        if old is not None and old.status == "True":
            conditions.set_condition(d, obs, kind=SIDECARS, true=False, reason="NoRestarts", msg="")
        return
    total = sum(car.restarts for _, car in restarted)
    pod, car = restarted[-1]
    how = car.reason or "exited"
    code = f" (exit {car.exit_code})" if car.exit_code is not None else ""
    msg = (
        f"{total} sidecar restarts in attempt {d.status.attempt}; last: sidecar {car.name} of"
        f" pod {pod.name} (node rank {pod.rank}) {how}{code}, restart {car.restarts}; not a"
        " rank failure"
    )
    if old is None or old.status != "True" or not old.message.startswith(f"{total} "):
        d.emit("SidecarRestarted", msg, warning=True)
        conditions.set_condition(
            d, obs, kind=SIDECARS, true=True, reason="SidecarRestarted", msg=msg
        )
