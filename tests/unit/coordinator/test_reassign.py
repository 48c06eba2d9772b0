"""Re-assigning a dead rank's unfinished episodes: disjoint shares by weight, from the planned order and the cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from coordinator.__main__ import build_parser
from coordinator.protocol_cli import dispatch
from coordinator.reassign import DeadShare, plan_takeover, reassign
from rollout_engine.errors import ConfigError
from rollout_engine.journal import Journal
from rollout_engine.takeover import load_takeover_plan, takeover_plan_path
from rollout_engine.tasks import load_tasks, plan_rank
from rollout_engine.types import Trajectory
from tests.unit.rollout_engine.engine_fakes import rollout_config, write_tasks


def ids(n: int) -> tuple[str, ...]:
    return tuple(f"t{i}#0" for i in range(n))


@pytest.mark.parametrize("weights", [[1, 1], [1, 1, 1], [2, 1, 3, 1], [1, 0, 2, 5], [0.5, 1.5, 1]])
@pytest.mark.parametrize("planned", [0, 1, 5, 17])
@pytest.mark.parametrize("done", [0, 1, 4])
def test_the_shares_are_disjoint_and_sum_to_the_unfinished(weights: list[float], planned: int, done: int) -> None:
    share = DeadShare(ids(planned), frozenset(ids(planned)[:done]))
    survivors = [r for r in range(len(weights)) if r != 1]
    assignments = reassign(weights, {1: share}, survivors)[1]
    assert sorted(assignments) == survivors  # every survivor has a list, maybe empty
    given = [episode for survivor in survivors for episode in assignments[survivor]]
    assert given == list(ids(planned)[done:])  # disjoint, complete, in planned order
    for survivor in survivors:
        exact = len(given) * weights[survivor] / sum(weights[s] for s in survivors)
        assert abs(len(assignments[survivor]) - exact) < 1  # by weight, largest remainder


def test_the_split_follows_the_planned_order_the_weights_and_skips_the_cut() -> None:
    share = DeadShare(("a#0", "b#0", "c#0", "d#0", "e#0"), frozenset({"b#0"}))
    assert reassign([1, 1, 2], {1: share}, [2, 0]) == {1: {0: ["a#0"], 2: ["c#0", "d#0", "e#0"]}}
    assert reassign([1, 1, 1], {1: share}, [0, 2]) == {1: {0: ["a#0", "c#0"], 2: ["d#0", "e#0"]}}  # tie: lower rank
    assert reassign([1, 1, 0], {1: share}, [0, 2]) == {1: {0: ["a#0", "c#0", "d#0", "e#0"], 2: []}}
    two = reassign([1, 1, 1, 1], {1: share, 3: DeadShare(("x#0", "y#0"), ())}, [0, 2])
    assert two == {1: {0: ["a#0", "c#0"], 2: ["d#0", "e#0"]}, 3: {0: ["x#0"], 2: ["y#0"]}}


def test_ranks_that_do_not_fit_are_named() -> None:
    share = DeadShare(ids(3), ())
    with pytest.raises(ConfigError) as err:
        reassign([1, 1], {1: share, 4: share}, [1, 0, 0])
    text = str(err.value)
    assert "rank 4 is not a rank of rank_weights=[1, 1]" in text
    assert "ranks [1] are both dead and survivors" in text and "survivors repeat a rank (got [1, 0, 0])" in text
    with pytest.raises(ConfigError, match=r"no survivor has a weight > 0 \(survivors \[0\], rank_weights=\[0, 1\]\)"):
        reassign([0, 1], {1: share}, [0])


def test_plan_takeover_cuts_the_journal_and_writes_the_plan(tmp_path: Path) -> None:
    write_tasks(tmp_path / "data", 12)
    cfg = rollout_config(tmp_path, 0, [1, 1, 1])
    planned = [s.episode_id for s in plan_rank(load_tasks(tmp_path / "data" / "tasks.jsonl"), cfg, 1)]
    directory = tmp_path / "log" / "trajectories" / "train" / "iter_0002"
    journal = Journal(directory / "rank_1.jsonl", resume=False)
    for episode in planned[:2]:
        task, sample = episode.split("#")
        journal.append(Trajectory(episode, task, int(sample), "train", 2, 1, "echo", "f", 1))
    with journal.path.open("a") as handle:
        handle.write('{"schema": "baton.traj')  # the dead rank was writing its third episode
    plan = plan_takeover(cfg, dead=[1], survivors=[0, 2])
    assert load_takeover_plan(takeover_plan_path(directory), "takeover_plan") == plan
    entry = plan.dead[1]
    assert (entry.cut.lines, entry.cut.episode_ids, entry.planned) == (2, tuple(planned[:2]), 4)
    assert entry.assignments == {0: [planned[2]], 2: [planned[3]]}


def test_the_takeover_plan_command_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_tasks(tmp_path / "data", 9)
    cfg = rollout_config(tmp_path, 0, [1, 1, 1])
    config = tmp_path / "rank_0.config.yaml"
    config.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    argv = ["takeover-plan", "--config", str(config), "--dead", "1", "--survivors", "0,2"]
    assert dispatch(build_parser().parse_args(argv)) == 0
    path, row = capsys.readouterr().out.splitlines()
    assert json.loads(Path(path).read_text())["dead"]["1"]["cut"]["lines"] == 0
    assert row == "1\t0\t0:2,2:1"
    argv[argv.index("0,2")] = "1,2"
    assert dispatch(build_parser().parse_args(argv)) == 2
    assert "ranks [1] are both dead and survivors" in capsys.readouterr().err
