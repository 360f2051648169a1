"""bench/fleet.py's plot: one panel per figure against the number of jobs, goals as lines.

Reads only the result dict (bench/results/fleet.json); a missing figure (a metric the operator
did not export) leaves its panel empty, saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# (title, y label, [(row key, legend, scale)], goal key or None)
PANELS: list[tuple[str, str, list[tuple[str, str, float]], str | None]] = [
    (
        "Job Running after its pods",
        "seconds",
        [("job_lag_p95_s", "p95", 1.0), ("job_lag_max_s", "max", 1.0)],
        "job_lag_s",
    ),
    (
        "Failure -> replacement pods",
        "seconds",
        [("replace_p50_s", "p50", 1.0), ("replace_p95_s", "p95", 1.0)],
        "replace_p95_s",
    ),
    ("Operator memory, idle", "MiB", [("rss_idle_kib", "VmRSS", 1 / 1024)], "idle_mib"),
    ("Operator memory per job", "KiB per job", [("kib_per_job", "VmRSS", 1.0)], "kib_per_job"),
    ("Operator CPU, steady", "% of one core", [("cpu_pct", "utime+stime", 1.0)], "cpu_pct"),
    (
        "LIST calls per reconcile pass",
        "LIST / pass",
        [
            ("list_per_pass_steady", "steady", 1.0),
            ("list_per_pass_bring_up", "bring-up", 1.0),
            ("list_per_pass_failures", "failures", 1.0),
        ],
        "list_per_pass_steady",
    ),
    (
        "Reconcile passes",
        "passes / s",
        [
            ("restart_passes_per_s", "a fresh operator passing every job", 1.0),
            ("passes_per_s_bring_up", "bring-up", 1.0),
            ("passes_per_s_steady", "steady", 1.0),
        ],
        "passes_per_s",
    ),
    (
        "Apply -> every job Running",
        "seconds",
        [
            ("apply_to_all_pods_running_s", "all pods Running", 1.0),
            ("apply_to_all_running_s", "all jobs Running", 1.0),
        ],
        None,
    ),
]


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (title, unit, series, goal) in zip(axes.flat, PANELS, strict=True):
        _panel(ax, rows, series)
        if goal is not None:
            ax.axhline(result["goals"][goal], color="tab:red", linestyle="--", label="goal")
        ax.set(title=title, xlabel="jobs", ylabel=unit)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"FSDPJob operator on a kwok fleet ({result['machine']}; operator "
        f"{result['operator_tree']})",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _panel(ax: Any, rows: list[dict[str, Any]], series: list[tuple[str, str, float]]) -> None:
    drawn = False
    for key, label, scale in series:
        points = [(r["jobs"], r[key] * scale) for r in rows if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=label)
            drawn = True
    if not drawn:
        ax.text(
            0.5,
            0.5,
            "no value: metric absent (or no pass in the window)",
            ha="center",
            transform=ax.transAxes,
        )
    counts = sorted({r["jobs"] for r in rows})
    if len(counts) > 1:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(counts, [str(c) for c in counts])
