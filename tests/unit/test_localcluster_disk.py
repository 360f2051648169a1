"""The nodes' image loads weighed against the free disk before a cluster starts: side by side
when all fit, one at a time when only one node's peak does, and a clear error otherwise (a
node out of space mid-import leaves a cluster whose pods never start)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from localcluster import controlplane, images, nodes

GIB = 1 << 30
Usage = collections.namedtuple("Usage", "total used free")


def _weigh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, need_gib: float, free_gib: float
) -> bool:
    monkeypatch.setattr(images, "disk_needed", lambda *, address, refs: int(need_gib * GIB))
    monkeypatch.setattr(
        controlplane.shutil, "disk_usage", lambda _: Usage(252 * GIB, 0, int(free_gib * GIB))
    )
    layouts = [nodes.layout(tmp_path, i) for i in range(4)]
    return controlplane._fits(layouts, refs=[images.WORKER])


def test_four_nodes_load_side_by_side_when_all_their_peaks_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _weigh(monkeypatch, tmp_path, need_gib=11.8, free_gib=60) is True


def test_nodes_load_one_at_a_time_when_only_one_peak_fits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _weigh(monkeypatch, tmp_path, need_gib=11.8, free_gib=20) is False
    assert "one at a time" in capsys.readouterr().err


def test_no_room_for_one_node_is_an_error_naming_the_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(controlplane.ControlPlaneError, match=r"needs 11\.8 GiB.*has 5\.0 GiB free"):
        _weigh(monkeypatch, tmp_path, need_gib=11.8, free_gib=5)


def test_nodes_that_hold_the_images_need_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _weigh(monkeypatch, tmp_path, need_gib=0, free_gib=3.5) is True
