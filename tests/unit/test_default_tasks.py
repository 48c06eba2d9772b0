"""The default task files: valid against the documented schema, deterministic,
train and test disjoint, and answers that reasoning-gym's own scorer accepts."""

from __future__ import annotations

import json
from pathlib import Path

import reasoning_gym

from rollout_engine.default_tasks import prepare
from rollout_engine.types import Task


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_files_are_valid_and_disjoint(tmp_path: Path) -> None:
    out = prepare(tmp_path)
    train, test = _rows(out / "train.jsonl"), _rows(out / "test.jsonl")
    assert (len(train), len(test)) == (320, 80)  # as docs/setup.md says
    ids = [r["task_id"] for r in train + test]
    assert len(ids) == len(set(ids)), "task ids are unique across both files"
    for row in train + test:
        task = Task.from_json(row)
        assert task.task_name and task.definite_answer is not None and task.difficulty == 1
        assert task.env == "reasoning_gym" and task.family in {"chain_sum", "basic_arithmetic"}
        entry = task.metadata["entry"]
        assert reasoning_gym.get_score_answer_fn(task.metadata["dataset"])(task.definite_answer, entry) == 1.0
    expressions = lambda rows: {r["metadata"]["entry"]["metadata"]["expression"] for r in rows}  # noqa: E731
    assert not expressions(train) & expressions(test), "no test expression appears in training"
    assert {r["family"] for r in test} == {"chain_sum", "basic_arithmetic"}


def test_generation_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    first = prepare(tmp_path / "a")
    second = prepare(tmp_path / "b")
    for name in ("train.jsonl", "test.jsonl"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    before = (first / "train.jsonl").stat().st_mtime_ns
    prepare(tmp_path / "a")
    assert (first / "train.jsonl").stat().st_mtime_ns == before, "a current file is left alone"


def test_a_corrupted_file_is_regenerated(tmp_path: Path) -> None:
    out = prepare(tmp_path)
    good = (out / "test.jsonl").read_bytes()
    (out / "test.jsonl").write_text('{"task_id": "broken"\n')
    prepare(tmp_path)
    assert (out / "test.jsonl").read_bytes() == good


def test_other_seed_gives_other_split(tmp_path: Path) -> None:
    a = _rows(prepare(tmp_path / "a", seed=0) / "test.jsonl")
    b = _rows(prepare(tmp_path / "b", seed=1) / "test.jsonl")
    assert [r["task_name"] for r in a] != [r["task_name"] for r in b]
