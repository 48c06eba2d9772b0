"""Taking over a dead rank's episodes: the cut of its journal, the plan file, the takeover rollout and its resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rollout_engine.errors import ConfigError
from rollout_engine.journal import Journal, read_journal
from rollout_engine.runner import plan_work, run_rollout
from rollout_engine.takeover import (
    Cut,
    DeadRank,
    TakeoverPlan,
    cut_journal,
    load_takeover_plan,
    read_cut,
    save_takeover_plan,
    takeover_plan_path,
)
from rollout_engine.tasks import load_tasks, plan_rank
from rollout_engine.types import Trajectory
from tests.unit.rollout_engine.engine_fakes import EchoEnv, rollout_config, use_fake_policy, write_tasks


def traj(episode_id: str, rank: int = 1) -> Trajectory:
    task, sample = episode_id.split("#")
    return Trajectory(episode_id, task, int(sample), "train", 2, rank, "echo", "f", 1, success=True)


def line(episode_id: str) -> str:
    return json.dumps(traj(episode_id).to_json()) + "\n"


def test_a_cut_counts_complete_lines_only_and_hashes_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "rank_1.jsonl"
    torn_middle = line("t1#0")[:30] + "\n"  # a write cut short, then a new line after it
    path.write_text(line("t0#0") + torn_middle + line("t2#0") + line("t3#0")[:40])  # torn last line
    cut = cut_journal(path)
    prefix = (line("t0#0") + torn_middle + line("t2#0")).encode()
    assert (cut.lines, cut.episode_ids) == (3, ("t0#0", "t2#0"))
    assert cut.sha256 == hashlib.sha256(prefix).hexdigest()
    assert cut_journal(tmp_path / "rank_9.jsonl") == Cut(0, (), hashlib.sha256(b"").hexdigest())


def test_what_the_dead_rank_appends_after_the_cut_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "rank_1.jsonl"
    path.write_text(line("t0#0") + line("t1#0")[:40])
    cut = cut_journal(path)
    with path.open("a") as handle:  # the evicted rank finishes its torn line and journals one more
        handle.write(line("t1#0")[40:] + line("t2#0"))
    assert [t.episode_id for t in read_journal(path)] == ["t0#0", "t1#0", "t2#0"]
    assert [t.episode_id for t in read_cut(path, cut.lines, cut.sha256)] == ["t0#0"]


def test_a_journal_changed_or_truncated_before_its_cut_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rank_1.jsonl"
    path.write_text(line("t0#0") + line("t1#0"))
    cut = cut_journal(path)
    path.write_text(line("t0#0") + line("t5#0"))
    with pytest.raises(ConfigError, match=r"first 2 lines are not the ones the master cut"):
        read_cut(path, cut.lines, cut.sha256)
    path.write_text(line("t0#0"))
    with pytest.raises(ConfigError, match=r"has 1 complete lines, fewer than its cut \(2\)"):
        read_cut(path, cut.lines, cut.sha256)


def plan(assignments: dict[int, list[str]], cut: Cut | None = None, **kw) -> TakeoverPlan:
    fields = {"split": "train", "iteration": 2, "rank_weights": [1.0, 1.0, 1.0]} | kw
    entry = DeadRank(cut or Cut(0, (), hashlib.sha256(b"").hexdigest()), 3, assignments)
    return TakeoverPlan(dead={1: entry}, **fields)


def test_the_plan_file_round_trips_and_a_bad_one_names_the_field(tmp_path: Path) -> None:
    written = plan({0: ["t3#0"], 2: ["t4#0", "t5#0"]}, Cut(1, ("t0#0",), "ab"))
    path = takeover_plan_path(tmp_path)
    save_takeover_plan(path, written)
    assert load_takeover_plan(path, "takeover_plan") == written
    assert json.loads(path.read_text())["dead"]["1"]["assignments"] == {"0": ["t3#0"], "2": ["t4#0", "t5#0"]}
    assert written.assigned_to(2) == {1: ["t4#0", "t5#0"]} and written.assigned_to(1) == {}
    with pytest.raises(ConfigError, match=r"takeover_plan='.*/nope.json' does not exist; point it at"):
        load_takeover_plan(tmp_path / "nope.json", "takeover_plan")
    path.write_text('{"schema": "baton.manifest/1"}')
    with pytest.raises(ConfigError, match=r"is not a baton.takeover/1 file \(got schema 'baton.manifest/1'\)"):
        load_takeover_plan(path, "takeover_plan")
    path.write_text('{"schema": "baton.takeover/1", "split": "train"}')
    with pytest.raises(ConfigError, match=r"lacks or misspells a field \(KeyError: 'iteration'\)"):
        load_takeover_plan(path, "takeover_plan")


@pytest.fixture
def cluster(tmp_path: Path) -> dict[int, list[str]]:
    """Nine tasks over three ranks of weight 1: each rank's planned episode ids."""
    write_tasks(tmp_path / "data", 9)
    cfg = rollout_config(tmp_path, 0, [1, 1, 1])
    tasks = load_tasks(tmp_path / "data" / "tasks.jsonl")
    return {r: [s.episode_id for s in plan_rank(tasks, cfg, r)] for r in range(3)}


def test_a_plan_that_does_not_fit_this_rollout_is_a_config_error_naming_the_field(
    tmp_path: Path, cluster: dict[int, list[str]]
) -> None:
    tasks = load_tasks(tmp_path / "data" / "tasks.jsonl")
    dead = cluster[1]
    save_takeover_plan(takeover_plan_path(tmp_path / "log"), plan({0: dead[:1], 2: dead[1:]}))
    cfg = rollout_config(tmp_path, 2, [1, 1, 1], takeover_plan="takeover.json")
    assert [(w.journal, [s.episode_id for s in w.specs]) for w in plan_work(cfg, tasks)] == [
        ("rank_2.takeover_1.jsonl", dead[1:])
    ]
    with pytest.raises(ConfigError, match=r"takeover_plan='.*takeover.json' names rank 1 dead \(got rank=1\)"):
        plan_work(rollout_config(tmp_path, 1, [1, 1, 1], takeover_plan="takeover.json"), tasks)
    save_takeover_plan(takeover_plan_path(tmp_path / "log"), plan({0: dead}))
    with pytest.raises(ConfigError, match=r"assigns nothing to rank 2 \(its survivors are \[0\]\); run the takeover"):
        plan_work(cfg, tasks)
    with pytest.raises(ConfigError, match=r"takeover_plan='.*missing.json' does not exist"):
        plan_work(rollout_config(tmp_path, 2, [1, 1, 1], takeover_plan="missing.json"), tasks)
    save_takeover_plan(takeover_plan_path(tmp_path / "log"), plan({0: ["t99#0"], 2: []}, iteration=5))
    with pytest.raises(ConfigError) as err:
        plan_work(rollout_config(tmp_path, 0, [1, 1, 1], takeover_plan="takeover.json"), tasks)
    assert "is the plan of split=train iteration=5, not of this rollout (split=train iteration=2)" in str(err.value)
    assert "assigns episodes of rank 1 that are not in its share as this rank plans it (t99#0)" in str(err.value)


async def test_a_takeover_rollout_journals_the_assigned_episodes_apart_and_resumes(
    tmp_path: Path, cluster: dict[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_policy(monkeypatch)
    dead = cluster[1]
    directory = tmp_path / "log" / "trajectories" / "train" / "iter_0002"
    save_takeover_plan(takeover_plan_path(directory), plan({0: dead[:2], 2: dead[2:]}))
    cfg = rollout_config(tmp_path, 0, [1, 1, 1], takeover_plan=str(takeover_plan_path(directory)), resume=True)
    Journal(directory / "rank_0.takeover_1.jsonl", resume=False).append(traj(dead[0], rank=0))  # before a crash
    EchoEnv.set_up.clear()
    assert await run_rollout(cfg, "resolved: yaml\n") == 0
    assert EchoEnv.set_up == [dead[1].split("#")[0]]  # the journaled episode is skipped
    journal = directory / "rank_0.takeover_1.jsonl"
    assert [t.episode_id for t in read_journal(journal)] == dead[:2]
    manifest = json.loads((directory / "rank_0.takeover_1.manifest.json").read_text())
    assert (manifest["episodes"], manifest["planned"], manifest["complete"]) == (2, 2, True)
    assert not (directory / "rank_0.jsonl").exists() and (directory / "rank_0.takeover.config.yaml").exists()
    record = json.loads((tmp_path / "log" / "metrics" / "rank_0.jsonl").read_text().splitlines()[-1])
    assert (record["takeover_of"], record["planned"], record["complete"]) == ([1], 2, True)
