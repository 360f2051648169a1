"""The throttle fault's rules (localcluster/throttle.py): the quota a fraction of a pod's CPU
comes to, the limit the kubelet had set, and the cgroup files, on a temporary tree (no root, no
cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import faults, throttle


@pytest.mark.parametrize(
    ("fraction", "cores", "quota"),
    [
        (0.5, 2.0, 100_000),  # two ranks at one thread each, to half speed: one CPU
        (0.5, 1.0, 50_000),
        (0.25, 4.0, 100_000),
        (1.0, 0.5, 50_000),
        (0.001, 0.001, throttle.MIN_QUOTA_US),  # the kernel's floor
    ],
)
def test_a_fraction_of_the_cpus_used_is_a_quota_per_period(
    fraction: float, cores: float, quota: int
) -> None:
    limit = throttle.quota_for(fraction=fraction, cores=cores)
    assert limit == throttle.Limit(quota, throttle.PERIOD_US)


@pytest.mark.parametrize(
    ("fraction", "cores", "words"),
    [(0.0, 1.0, "fraction 0.0"), (1.5, 1.0, "fraction 1.5"), (0.5, 0.0, "cores 0.0")],
)
def test_a_fraction_or_cores_out_of_range_says_which(
    fraction: float, cores: float, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        throttle.quota_for(fraction=fraction, cores=cores)


@pytest.mark.parametrize(
    ("cpu", "quota"), [(None, -1), ("", -1), ("500m", 50_000), ("2", 200_000), ("1.5", 150_000)]
)
def test_undoing_restores_the_limit_the_kubelet_set(cpu: str | None, quota: int) -> None:
    assert throttle.kube_limit(cpu).quota_us == quota


def test_the_limit_is_written_period_first_and_read_back(tmp_path: Path) -> None:
    (tmp_path / throttle.QUOTA_FILE).write_text("-1\n")
    (tmp_path / throttle.PERIOD_FILE).write_text("100000\n")
    assert throttle.read_limit(tmp_path).cores is None
    throttle.write_limit(tmp_path, throttle.Limit(25_000, 50_000))
    assert throttle.read_limit(tmp_path) == throttle.Limit(25_000, 50_000)
    assert throttle.read_limit(tmp_path).cores == 0.5


def test_cores_used_is_cpu_time_over_wall_time(tmp_path: Path) -> None:
    usage = tmp_path / throttle.USAGE_FILE
    usage.write_text("1000000000")
    clock = iter([10.0, 12.0])

    def sleep(seconds: float) -> None:
        assert seconds == 2.0
        usage.write_text(str(1_000_000_000 + 3_000_000_000))  # 3 CPU-seconds in 2 s

    assert throttle.cores_used(tmp_path, clock=lambda: next(clock), sleep=sleep) == 1.5


def test_the_command_line_takes_a_fraction_and_cores() -> None:
    args = faults._parser().parse_args(
        ["throttle", "ns/pod-1", "--fraction", "0.4", "--cores", "2"]
    )
    assert (args.verb, args.pod, args.fraction, args.cores) == ("throttle", "ns/pod-1", 0.4, 2.0)
    assert faults._parser().parse_args(["unthrottle", "pod-1"]).verb == "unthrottle"
