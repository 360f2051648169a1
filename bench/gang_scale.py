"""One gang of N simulated nodes: failure -> every node restarted, the coordinator's CPU, memory
and messages, as N grows (issue 44, "one gang at scale"). Numbers, not pass/fail.

    PYTHONPATH=. .venv/bin/python bench/gang_scale.py [--nodes 8 64 256 1024] [--repeats 3]
        [--before REF]

Each size runs bench/gang_scale_nodes.py: the real keepers and coordinator over real sockets on
127.0.0.1, a rank stand-in in place of torchrun, node rank 0's keeper (the coordinator) in a
process of its own and every other node's keeper a thread of a second one. After bring-up, a
steady window with no failure (coordinator connections per second, its CPU), then `--repeats`
times the last node's ranks exit 1 and the clock runs until every node, node 0 included, has
started the next generation. `--before REF` runs the same scenario, in the same run, against
the keeper of commit REF (git archive of worker/), labelled "before"; the working tree is
"after". Writes bench/results/gang_scale.json and docs/gang_scale.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gang_scale.json"
PLOT = ROOT / "docs" / "gang_scale.png"
NODES = __file__.replace("gang_scale.py", "gang_scale_nodes.py")
GOALS = {"restarted_s_max_at_1024": 3.0, "ratio_1024_to_8": 2.0}


def run_size(nodes: int, *, worker: Path, repeats: int, steady_s: float) -> dict[str, Any]:
    """One gang of `nodes`, the keeper imported from `worker`; its row of figures."""
    base_port = random.randrange(10000, 30000 - nodes)  # below the ephemeral range
    with tempfile.NamedTemporaryFile(prefix="gang-scale-termination-") as log:
        env = {
            **os.environ,
            "PYTHONPATH": f"{worker}{os.pathsep}{ROOT}",
            "FSDP_TERMINATION_LOG": log.name,
            "FSDP_WARM_LAUNCH": "0",
        }
        command = [sys.executable, NODES, str(nodes), str(repeats), str(base_port), str(steady_s)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{nodes} nodes: exit {done.returncode}\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(lines[-1])
    return row


def tree_of(ref: str, into: Path) -> Path:
    """worker/ of commit `ref`, extracted under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "worker"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "worker"


def _commit(ref: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True
    )
    return out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steady", type=float, default=4.0, help="seconds of the steady window")
    ap.add_argument("--before", help="a commit whose keeper runs the same scenario")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plot", type=Path, default=PLOT)
    args = ap.parse_args()
    variants = {"after": (ROOT / "worker", _commit("HEAD") + ("+" if _dirty() else ""))}
    result: dict[str, Any] = {
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, python {platform.python_version()}",
        "command": " ".join(["bench/gang_scale.py", *sys.argv[1:]]),
        "goals": GOALS,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="gang-scale-before-") as tmp:
        if args.before:
            variants = {"before": (tree_of(args.before, Path(tmp)), _commit(args.before))} | (
                variants
            )
        for label, (_, commit) in variants.items():
            result["variants"][label] = {"commit": commit, "sizes": []}
        for nodes in args.nodes:  # sizes outer, variants inner: both see the same machine
            for label, (worker, _) in variants.items():
                began = time.time()
                row = run_size(nodes, worker=worker, repeats=args.repeats, steady_s=args.steady)
                row["wall_s"] = round(time.time() - began, 1)
                result["variants"][label]["sizes"].append(row)
                print(label, json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.plot)
    print(f"wrote {args.out} and {args.plot}")


def _dirty() -> bool:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "worker"], capture_output=True, text=True
    )
    return bool(out.stdout.strip())


# (title, y label, row key, log y)
PANELS = [
    ("Failure -> every node restarted (p50, max)", "seconds", "restarted", False),
    ("Coordinator connections per failure", "connections", "msgs_per_failure", True),
    ("Coordinator connections, steady", "per second", "steady_msgs_per_s", True),
    ("Coordinator process CPU, steady", "% of one core", "steady_cpu_pct", False),
    ("Coordinator CPU per failure", "CPU seconds", "cpu_s_per_failure", False),
    ("Coordinator process peak RSS", "MB", "coordinator_peak_mb", False),
]


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, unit, key, log_y) in zip(axes.flat, PANELS, strict=True):
        for label, variant in result["variants"].items():
            _series(ax, f"{label} ({variant['commit']})", variant["sizes"], key)
        if key == "restarted":
            ax.axhline(GOALS["restarted_s_max_at_1024"], color="tab:red", ls="--", label="goal")
        ax.set(title=title, xlabel="nodes", ylabel=unit, xscale="log")
        if log_y:
            ax.set_yscale("log")
        counts = sorted({r["nodes"] for v in result["variants"].values() for r in v["sizes"]})
        ax.minorticks_off()
        ax.set_xticks(counts, [str(c) for c in counts])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"One gang of N simulated nodes ({result['machine']})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _series(ax: Any, label: str, rows: list[dict[str, Any]], key: str) -> None:
    keys = [("restarted_p50_s", "p50"), ("restarted_max_s", "max")] if key == "restarted" else []
    for k, what in keys or [(key, "")]:
        points = [(r["nodes"], r[k]) for r in rows if r.get(k) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=f"{label} {what}".strip())


if __name__ == "__main__":
    main()
