"""Every chart alert pages the right people and says what to do: a `runbook_url` whose anchor is
a section of docs/operations.md, "Runbooks", and (per-job alerts) the job's namespace as
`namespace`. Read from the rule template as written; promtool tests what the rules compute
(tests/cluster/test_monitoring.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
RULES = (ROOT / "charts" / "fsdp-operator" / "files" / "alerts.yaml").read_text()
RUNBOOKS = (ROOT / "docs" / "operations.md").read_text().split("\n## Runbooks\n", 1)[1]
ALERTS = re.split(r"\n(?=\s+- alert: )", RULES)[1:]
NAMES = [re.search(r"- alert: (\w+)", a).group(1) for a in ALERTS]  # type: ignore[union-attr]


def test_the_new_day_one_alerts_exist() -> None:
    assert {"FSDPJobFirstCheckpointNeverSealed", "FSDPJobStuckQueued", "FSDPJobFailed"} <= set(
        NAMES
    )


@pytest.mark.parametrize(("name", "rule"), list(zip(NAMES, ALERTS, strict=True)), ids=NAMES)
def test_each_alert_links_its_runbook_section(name: str, rule: str) -> None:
    assert f'runbook_url: "{{{{ $r }}}}#{name.lower()}"' in rule
    section = RUNBOOKS.split(f"\n### {name}\n", 1)
    assert len(section) == 2, f"docs/operations.md has no runbook '### {name}'"
    assert len(section[1].split("\n#", 1)[0].strip()) > 100, f"{name}'s runbook says nothing"


@pytest.mark.parametrize(("name", "rule"), list(zip(NAMES, ALERTS, strict=True)), ids=NAMES)
def test_per_job_alerts_page_the_jobs_namespace(name: str, rule: str) -> None:
    labels = re.search(r"labels: \{(.*)\}", rule).group(1)  # type: ignore[union-attr]
    assert ('namespace: "{{ $owner }}"' in labels) == name.startswith("FSDPJob")
    assert '$owner := "{{ $labels.job_namespace }}"' in RULES
