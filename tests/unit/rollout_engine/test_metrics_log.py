"""metrics.jsonl and the update's own file: one writer each, merged once (rollout_engine/metrics_log.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rollout_engine.layout import Layout
from rollout_engine.metrics import save_metrics
from rollout_engine.metrics_log import SEQ, append_update, load_metrics, merge_update


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_update_writes_its_own_file_numbered_and_nothing_to_metrics_jsonl(tmp_path: Path) -> None:
    append_update(tmp_path, {"kind": "training", "iteration": 1})
    append_update(tmp_path, {"kind": "promotion", "iteration": 1, "policy_version": 1})
    assert [(r["kind"], r[SEQ]) for r in lines(Layout(tmp_path).update_metrics)] == [("training", 1), ("promotion", 2)]
    assert not Layout(tmp_path).metrics.exists()


def test_an_append_after_a_torn_line_starts_its_own_line_and_numbers_on(tmp_path: Path) -> None:
    append_update(tmp_path, {"kind": "training", "iteration": 1})
    with Layout(tmp_path).update_metrics.open("a") as f:
        f.write('{"kind": "promotion", "iter')  # a crash mid-write
    append_update(tmp_path, {"kind": "training", "iteration": 2})
    assert [(r["iteration"], r[SEQ]) for r in load_metrics(tmp_path)] == [(1, 1), (2, 2)]


def test_the_merge_copies_each_record_once_in_order_and_readers_see_each_once(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    save_metrics(layout.metrics, {"kind": "rollout", "split": "train", "iteration": 1})
    append_update(tmp_path, {"kind": "training", "iteration": 1})
    # before any merge the readers already see the update's record, once
    assert [r["kind"] for r in load_metrics(tmp_path)] == ["rollout", "training"]
    assert merge_update(tmp_path) == 1
    assert merge_update(tmp_path) == 0
    append_update(tmp_path, {"kind": "promotion", "iteration": 1, "policy_version": 1})
    save_metrics(layout.metrics, {"kind": "rollout", "split": "train", "iteration": 2})
    assert [r["kind"] for r in load_metrics(tmp_path)] == ["rollout", "training", "rollout", "promotion"]
    assert merge_update(tmp_path) == 1
    assert [r["kind"] for r in lines(layout.metrics)] == ["rollout", "training", "rollout", "promotion"]
    assert load_metrics(tmp_path) == lines(layout.metrics)


def test_a_merge_cut_short_by_a_crash_goes_on_where_it_stopped(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    for iteration in (1, 2, 3):
        append_update(tmp_path, {"kind": "training", "iteration": iteration})
    first = lines(layout.update_metrics)[0]
    layout.metrics.write_text(json.dumps(first) + "\n" + json.dumps(lines(layout.update_metrics)[1])[:20])
    assert merge_update(tmp_path) == 2  # the torn copy of record 2 is no record: 2 and 3 come again
    assert [r["iteration"] for r in load_metrics(tmp_path)] == [1, 2, 3]


def test_a_line_another_host_is_still_appending_waits_for_the_next_merge(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    append_update(tmp_path, {"kind": "training", "iteration": 1})
    whole = layout.update_metrics.read_bytes()
    layout.update_metrics.write_bytes(whole[:-1])  # what a reader sees before the newline lands
    assert merge_update(tmp_path) == 0 and load_metrics(tmp_path) == []
    layout.update_metrics.write_bytes(whole)
    assert merge_update(tmp_path) == 1 and [r["kind"] for r in load_metrics(tmp_path)] == ["training"]
