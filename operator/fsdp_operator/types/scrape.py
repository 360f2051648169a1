"""What the operator scrapes off rank 0: Prometheus samples, each a name, its labels and a value.

A sample keeps its name and labels apart (never flattened into `name{k=v}` text and re-parsed
by prefix), so a label value may hold any character (a restart record is JSON) and a reader asks
for a series by name and labels. Pure data: io/kube.py parses the Prometheus text page into it,
io/observe.py reads it; no I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

# A sample's labels as sorted (name, value) pairs: hashable, and one spelling per label set.
Labels = tuple[tuple[str, str], ...]


def labels_of(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


class Scrape:
    """One scraped page's samples, by name and labels; a series served twice keeps its last
    value (as Prometheus would)."""

    def __init__(self, samples: Iterable[Sample] = ()) -> None:
        self._values = {(s.name, s.labels): s.value for s in samples}

    def value(self, name: str, **labels: str) -> float | None:
        """The series `name{labels}` (exactly those labels); None when the page lacks it."""
        return self._values.get((name, labels_of(labels)))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """The series of `name` whose one label is `label`: each value by that label's value."""
        return {
            labels[0][1]: value
            for (named, labels), value in self._values.items()
            if named == name and len(labels) == 1 and labels[0][0] == label
        }
