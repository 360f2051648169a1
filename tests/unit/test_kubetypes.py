"""kubetypes.py is exactly what kubegen.py makes of the pinned Kubernetes release's OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_operator.types import api, kubetypes
from hack import kubegen

ROOT = Path(__file__).resolve().parents[2]


def test_committed_types_match_the_upstream_openapi() -> None:
    # The OpenAPI document ships inside the k8s.io/kubernetes module (the Go module cache).
    source = kubegen.find_openapi()
    assert source.is_file(), source
    committed = (ROOT / "operator" / "fsdp_operator" / "types" / "kubetypes.py").read_text()
    assert committed == kubegen.render(
        json.loads(source.read_text())
    ), "run: python -m hack.kubegen > operator/fsdp_operator/types/kubetypes.py"


def test_volumes_offer_only_what_pod_security_restricted_allows() -> None:
    sources = set(kubetypes.Volume.model_fields) - {"name"}
    assert sources == set(kubegen.RESTRICTED_VOLUME_SOURCES)
    assert set(api.Volume.model_fields) == set(kubetypes.Volume.model_fields)


def test_quantities_parse_every_form_kubernetes_accepts() -> None:
    cases = {"8": 8, "500m": 0.5, "4Gi": 4 * 2**30, "1e3": 1000, ".5": 0.5, "2Ei": 2 * 2**60}
    for text, value in cases.items():
        assert api.quantity(text) == value
    assert api.quantity(8) == 8
