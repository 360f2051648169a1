"""Restarts in place (fsdp_worker.keeper.gang): two pods' keepers, each in front of a real torchrun
running the stand-in worker, on this machine. A rank's crash restarts both nodes' ranks
without their keepers (the pods' containers) ending; the restart resumes from the newest
checkpoint sealed before the crash; a failure past the allowed restarts ends the failing
node's keeper with its rank's message and leaves the other waiting for the operator."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from worker_harness import REPO, free_port, gang_creds, keeper_logs, launch_keepers, wait_all

from fsdp_worker import contract
from fsdp_worker.contract import catalog
from fsdp_worker.contract import keeper as keeper_wire
from fsdp_worker.keeper.processes import descendants

pytestmark = pytest.mark.torch


def _keepers(
    root: Path, *, restarts: int, steps: int, spares: int = 0, **knobs: str
) -> list[subprocess.Popen[bytes]]:
    config = {
        "training": {"steps": steps, "globalBatchSize": 2, "microBatchSize": 1},
        "checkpoint": {"root": str(root / "ck"), "intervalSteps": 10},
    }
    env = {"STANDIN_STEP_SECONDS": "0.05", contract.ENV_CHECKPOINT_ROOT: str(root / "ck"), **knobs}
    return launch_keepers(
        root,
        restarts=restarts,
        config=config,
        env=env,
        spares=spares,
        module="fsdp_worker.train.standin",
    )


def _ask(root: Path, address: tuple[str, int], doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` to a keeper of this test's gang, signed as the operator signs it."""
    return keeper_wire.ask(address, doc, creds=gang_creds(root))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _gang_env(root: Path, node: int) -> str:
    """The FSDP_GANG a keeper of this test was given (from its process environment)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{contract.ENV_TERMINATION_LOG}={root}/term-{node}".encode() in env:
            for item in env:
                if item.startswith(f"{contract.ENV_GANG}=".encode()):
                    return item.split(b"=", 1)[1].decode()
    raise AssertionError(f"no keeper of node {node} under {root}")


def test_a_crashed_rank_restarts_both_nodes_in_place_from_the_newest_seal(tmp_path: Path) -> None:
    procs = _keepers(
        tmp_path, restarts=2, steps=60, STANDIN_FAIL_AT_STEP="25", STANDIN_FAIL_RANK="1"
    )
    try:
        codes = wait_all(procs, 120)
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp_path)
    assert codes == [0, 0], logs
    # Each keeper restarted its torchrun once, into generation 1, after rank 1's failure.
    restarts = re.findall(r"restarting in place: generation (\d+) after (.*)", logs)
    assert [g for g, _ in restarts] == ["1", "1"], logs
    record = json.loads(restarts[0][1].replace("'", '"').replace("True", "true"))[0]
    assert (record["rank"], record["step"], record["generation"]) == (1, 25, 0)
    assert record["class"] == contract.FailureClass.RUNTIME.value
    assert record["node"] == 1 and record["torchrunExitCode"] == 1
    # The restart resumed from step 20 (sealed before the crash at 25) and finished the run.
    assert "resume=auto: step 20" in logs, logs
    assert (tmp_path / "ck" / catalog.step_dir_name(60) / catalog.MARKER_NAME).is_file()


def test_past_its_restarts_the_failing_node_ends_and_the_other_waits(tmp_path: Path) -> None:
    procs = _keepers(
        tmp_path,
        restarts=1,
        steps=200,
        STANDIN_FAIL_AT_STEP="25",
        STANDIN_FAIL_RANK="1",
        STANDIN_FAIL_GENERATION="-1",
    )
    try:
        codes = wait_all(procs[1:], 120)
        assert codes == [1], keeper_logs(tmp_path)
        time.sleep(1.0)
        assert procs[0].poll() is None, keeper_logs(tmp_path)  # node 0 waits for the operator
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp_path)
    assert len(re.findall(r"restarting in place: generation 1 ", logs)) == 2, logs
    # The failing node's pod would show its rank's own message, as without restarts in place.
    doc = json.loads((tmp_path / "term-1").read_text())
    assert (doc["class"], doc["rank"], doc["message"]) == ("RuntimeError", 1, "injected")


def test_a_rank_past_its_hang_deadline_ends_itself_only_with_restarts_in_place(
    tmp_path: Path,
) -> None:
    """The flight watchdog's deadline (FSDP_HANG_SECONDS): with a keeper in front of torchrun
    the rank writes a Hang message and exits 1 (its keeper restarts the gang in place);
    without one it only reports its stacks and keeps waiting, for the operator to decide."""
    script = (
        "import time\n"
        "import torch  # noqa: F401 (a worker has it; the stall report reads its recorder)\n"
        "from fsdp_worker.telemetry import flight\n"
        "rec = flight.Recorder(rank=3, local_rank=1, attempt=2)\n"
        "rec.step_done(41)\n"
        "rec.watch(hang_seconds=1, evidence_root=None)\n"
        "time.sleep(6)\n"
        "print('still waiting')\n"
    )
    for keeper in (True, False):
        log = tmp_path / f"term-{keeper}"
        log.touch()
        env = dict(
            os.environ, PYTHONPATH=str(REPO / "worker"), **{contract.ENV_TERMINATION_LOG: str(log)}
        )
        if keeper:
            env[contract.ENV_GANG] = "{}"
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        if keeper:
            assert done.returncode == 1 and "still waiting" not in done.stdout, done.stderr
            doc = json.loads(log.read_text())
            assert (doc["class"], doc["rank"], doc["step"]) == ("Hang", 3, 41), doc
        else:
            assert done.returncode == 0 and "still waiting" in done.stdout, done.stderr
            assert "no step completed" in done.stderr and not log.read_text().strip()
    # before this process's first step, the startup allowance (FSDP_STARTUP_SECONDS) counts
    starting = (
        script.replace("rec.step_done(41)\n", "")
        .replace("hang_seconds=1,", "hang_seconds=1, startup_seconds=60,")
        .replace("sleep(6)", "sleep(4)")
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "worker"), **{contract.ENV_GANG: "{}"})
    done = subprocess.run(
        [sys.executable, "-c", starting], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "still waiting" in done.stdout, done.stderr
    assert "no step completed" not in done.stderr, done.stderr


def _sealed(root: Path, step: int, nodes: int) -> None:
    cut = root / "ck" / catalog.step_dir_name(step) / catalog.MARKER_NAME
    deadline = time.monotonic() + 60
    while not cut.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cut.is_file(), keeper_logs(root, nodes)


def _warm_launcher(pid: int) -> bool:
    try:
        return b"fsdp_worker.keeper.warm" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _freeze(proc: subprocess.Popen[bytes]) -> list[int]:
    frozen = [proc.pid, *descendants(proc.pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    return frozen


def _thaw_once_resumed(spare_log: Path, frozen: list[int]) -> None:
    """The lost node comes back once the spare resumed, while the gang trains without it."""
    deadline = time.monotonic() + 60
    while "resume=auto" not in spare_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize(
    "others_first", [False, True], ids=["replaced-first", "others-failed-first"]
)
def test_a_spare_takes_a_lost_nodes_place_and_the_lost_keeper_is_fenced(
    tmp_path: Path, others_first: bool
) -> None:
    """Node 1's pod is cut off (its keeper and ranks frozen, as in a frozen pod or on a node
    that stopped); the operator's `replace` gives its place to the warm spare: the gang
    restarts in place with the spare as node 1, resumes from the claim (a spare holds no
    memory) and finishes. When the lost node comes back its keeper finds its node taken and
    stops its ranks. `others_first`: node 0's ranks end first (as a frozen peer's others do at
    their own hang watchdog, before the operator's verdict): the gang is coming down from
    generation 0 when the replace arrives, and the spare joins the generation node 0 waits
    to start."""
    from fsdp_worker.keeper import gang

    procs = _keepers(tmp_path, restarts=2, steps=80, spares=1)
    node1 = procs[1]
    try:
        _sealed(tmp_path, 20, 3)
        frozen = _freeze(node1)
        coordinator = gang.Gang.from_env(_gang_env(tmp_path, 0)).address
        # the frozen keeper falls silent in its coordinator's answer (what the operator asks
        # in a hang's grace), the others keep asking
        deadline = time.monotonic() + 30
        while (quiet := _ask(tmp_path, coordinator, {"op": "state"})["quiet"])["1"] < 5.0:
            assert time.monotonic() < deadline, quiet
            time.sleep(0.5)
        assert quiet["0"] < 2.0, quiet
        if others_first:  # what node 0's keeper sends when its ranks' watchdog ends them
            hung = {"class": "Hang", "message": "no step for 10s", "rank": 0}
            _ask(tmp_path, coordinator, {"op": "fail", "generation": 0, "failure": hung, "from": 0})
            deadline = time.monotonic() + 30
            while _ask(tmp_path, coordinator, {"op": "state"})["down"].get("0") != [0]:
                assert time.monotonic() < deadline, keeper_logs(tmp_path, 3)
                time.sleep(0.2)
        # what the operator sends for a frozen pod (decide._take_over); a lost node's says
        # NodeLost, and the survivors' ranks are brought down the same way
        why = {"class": "Hang", "message": "node rank 1's keeper silent"}
        answer = _ask(
            tmp_path, coordinator, {"op": "replace", "node": 1, "spare": 0, "failure": why}
        )
        assert not answer.get("refused") and answer["holders"] == {"1": 0}, answer
        again = _ask(tmp_path, coordinator, {"op": "replace", "node": 1, "spare": 0})
        assert "already holds" in again["refused"]
        _thaw_once_resumed(tmp_path / "node-2.log", frozen)
        codes = wait_all([procs[0], procs[2]], 120)
        assert codes == [0, 0], keeper_logs(tmp_path, 3)
        assert "node 1 was given to a spare" in (tmp_path / "node-1.log").read_text()
        assert node1.poll() is None  # it waits for the operator, its ranks stopped
        # its keeper kills them (its warm launcher, kept for a `follow`, is no rank); polled
        deadline = time.monotonic() + 30
        while running := [p for p in frozen[1:] if _alive(p) and not _warm_launcher(p)]:
            assert time.monotonic() < deadline, f"the lost node's old ranks still run: {running}"
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp_path, 3)
    assert "spare 0 takes node 1's place" in logs, logs
    restarts = re.findall(r"restarting in place: generation (\d+) after (.*)", logs)
    assert [g for g, _ in restarts] == ["1"], logs  # node 0 (the spare started there)
    assert "'class': 'Hang'" in restarts[0][1] and "'spare': 0" in restarts[0][1]
    assert ("'symptom': 'no step for 10s'" in restarts[0][1]) is others_first, restarts
    assert "resume=auto: step 20" in logs or "resume=auto: step 30" in logs, logs
    assert (tmp_path / "ck" / catalog.step_dir_name(80) / catalog.MARKER_NAME).is_file()


def test_a_spare_takes_node_rank_0s_place_as_coordinator_and_the_others_follow(
    tmp_path: Path,
) -> None:
    """Node rank 0's pod is cut off (frozen whole: its keeper was the gang's coordinator, its
    rank hosted the store). What the operator then sends (keepers._promote): `promote` to
    spare 0's keeper, `follow` to node 1's. Node 1 stops its ranks and rejoins with what node
    0's coordinator last said; spare 0, now node 0 and the coordinator, hosts the store at a
    new address; the gang restarts in place from the claim, the old node 0 thawed beside it
    (the generation fence keeps it from publishing: test_catalog). Then node 1's pod freezes:
    spare 1, whose template names the first node 0, is told where the coordinator and the
    store are now (keepers._replace: `follow`, then `replace`), takes node 1's place, and the
    gang finishes."""
    from fsdp_worker.keeper import gang

    procs = _keepers(tmp_path, restarts=3, steps=160, spares=2)
    port = {n: gang.Gang.from_env(_gang_env(tmp_path, n)).listen_port for n in (1, 2, 3)}
    try:
        _sealed(tmp_path, 20, 4)
        frozen = _freeze(procs[0])
        master, coordinator = f"127.0.0.1:{free_port()}", f"127.0.0.1:{port[2]}"
        node0 = ("127.0.0.1", port[2])
        lost = {"class": "NodeLost", "pod": "job-a1-0", "message": "node n0 stopped renewing"}
        answer = _ask(tmp_path, node0, {"op": "promote", "master": master, "failure": lost})
        assert answer["gathering"] and answer["holders"] == {"0": 0}, answer
        follow = {"op": "follow", "coordinator": coordinator, "master": master}
        assert _ask(tmp_path, ("127.0.0.1", port[1]), follow) == {"following": coordinator}
        _thaw_once_resumed(tmp_path / "node-2.log", frozen)
        _sealed(tmp_path, 70, 4)
        _freeze(procs[1])
        assert _ask(tmp_path, ("127.0.0.1", port[3]), follow) == {"following": coordinator}
        why = {"class": "Hang", "message": "node rank 1's keeper silent"}
        answer = _ask(tmp_path, node0, {"op": "replace", "node": 1, "spare": 1, "failure": why})
        assert not answer.get("refused") and answer["holders"] == {"0": 0, "1": 1}, answer
        codes = wait_all([procs[2], procs[3]], 120)
        assert codes == [0, 0], keeper_logs(tmp_path, 4)
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp_path, 4)
    assert "spare 0 takes node 0's place" in logs and "spare 1 takes node 1's place" in logs, logs
    assert "node 1 follows its successor's coordinator" in logs, logs
    restarts = re.findall(r"restarting in place: generation (\d+) after (.*)", logs)
    # node 1 after node 0's loss, node 0 (spare 0) after node 1's freeze
    assert [g for g, _ in restarts] == ["1", "2"], logs
    assert "'class': 'NodeLost'" in restarts[0][1] and "'spare': 0" in restarts[0][1]
    assert "'class': 'Hang'" in restarts[1][1] and "'spare': 1" in restarts[1][1]
    assert "resume=auto: step 20" in logs or "resume=auto: step 30" in logs, logs
    assert (tmp_path / "ck" / catalog.step_dir_name(160) / catalog.MARKER_NAME).is_file()


def test_a_spares_argv_takes_the_node_rank_once() -> None:
    from fsdp_worker.keeper import torchrun_argv

    argv = ["python", "-m", "torch.distributed.run", "--node-rank=0", "-m", "x", "--node-rank=7"]
    assert torchrun_argv.with_node_rank(argv, 3)[3] == "--node-rank=3"
    assert (
        torchrun_argv.with_node_rank(argv, 3)[-1] == "--node-rank=7"
    )  # the trainer's own argument
    assert torchrun_argv.with_node_rank(["--node_rank", "0", "a"], 2) == ["--node_rank", "2", "a"]
