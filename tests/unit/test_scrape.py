"""Rank 0's samples keep their names and labels apart from the page to the decisions: a label
value is never re-parsed out of `name{k=v}` text."""

from __future__ import annotations

from fsdp_operator.io import kube, observe, reports
from fsdp_operator.types import scrape
from fsdp_worker import contract


def test_two_series_whose_flattened_text_would_collide_stay_apart() -> None:
    page = (
        "# TYPE fsdp_train_x gauge\n"
        'fsdp_train_x{a="1,b=2"} 1.0\n'
        'fsdp_train_x{a="1",b="2"} 2.0\n'
        "fsdp_train_x 3.0\n"
        "# TYPE other_metric gauge\nother_metric 4.0\n"
    )
    got = kube.contract_samples(page)
    assert got.value("fsdp_train_x", a="1,b=2") == 1.0
    assert got.value("fsdp_train_x", a="1", b="2") == 2.0
    assert got.value("fsdp_train_x") == 3.0
    assert got.value("fsdp_train_x", a="1") is None  # exactly those labels, never a prefix
    assert got.value("other_metric") is None  # not the contract's
    assert got.by_label("fsdp_train_x", "a") == {"1,b=2": 1.0}  # the series with `a` alone


def test_a_restart_record_from_the_coordinator_reaches_the_operator_whole() -> None:
    record = {"generation": 0, "message": 'ValueError: {"x": 1}, then b=c}', "node": 1}
    (got,) = reports.in_place_records([record, {"no": "generation"}, "not a record"])
    assert (got.generation, got.node) == (0, 1)
    assert got.termination.words == record["message"]  # braces, commas and `=` inside, whole


def test_a_page_that_is_not_prometheus_text_says_nothing() -> None:
    got = kube.contract_samples("<html>503</html>")
    assert got.value(contract.METRIC_STEP) is None
    assert observe.progress_of(got).step is None


def test_a_series_served_twice_keeps_its_last_value() -> None:
    twice = scrape.Scrape(
        [scrape.Sample("fsdp_train_step", (), 1.0), scrape.Sample("fsdp_train_step", (), 2.0)]
    )
    assert twice.value("fsdp_train_step") == 2.0
