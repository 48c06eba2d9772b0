"""Sharegpt rows and dataset files written from selected samples."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout_engine.envs.base import Env, EpisodeState, Score, StepResult
from rollout_engine.errors import ConfigError
from rollout_engine.images import file_url
from rollout_engine.journal import Journal, read_journal
from rollout_engine.progress import Progress
from rollout_engine.scheduler import Scheduler, SchedulerSettings
from rollout_engine.types import Completion, EpisodeSpec, Message, Task
from tests.unit.training.trajectories import traj, turn
from training.dataset import convert_messages, dataset_digest, drop_rows, save_dataset, to_row, token_ids
from training.selection import DPOSelector, KTOSelector, RFTSelector
from training.update import RunPaths, TrainingError, wait_for_dataset


def multi_turn_sample():
    first = turn(0, response="look")
    second = turn(1, response="7")
    second.messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "2+5?"},
        {"role": "assistant", "content": "look"},
        {"role": "tool", "content": "obs"},
    ]
    return RFTSelector().select([traj("a", 0, True, turns=[first, second])], 0, 2048).samples[1]


def test_sft_row_holds_history_and_the_sampled_reply_last() -> None:
    row = to_row(multi_turn_sample(), "sft")
    assert row["system"] == "sys" and row["images"] == []
    assert row["conversations"] == [
        {"from": "human", "value": "2+5?"},
        {"from": "gpt", "value": "look"},
        {"from": "observation", "value": "obs"},
        {"from": "gpt", "value": "7"},
    ]


def test_image_parts_become_placeholders_and_paths(tmp_path: Path) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Screen: "},
                {"type": "image_url", "image_url": {"url": "file:///l/s.png"}},
            ],
        }
    ]
    assert convert_messages(messages, "x") == ("", [{"from": "human", "value": "Screen: <image>"}], ["/l/s.png"])
    # the URL the episode loop sends (rollout_engine.images.file_url: `#` in an episode id percent-encoded) names
    # the file again
    shot = tmp_path / "images" / "mw-click-test-0000#0" / "step_000.png"
    sent = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": file_url(shot)}}]}]
    assert convert_messages(sent, "x")[2] == [str(shot)]
    with pytest.raises(ConfigError, match="inline"):
        convert_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:a"}}]}], "x")
    with pytest.raises(ConfigError, match="role 'critic'"):
        convert_messages([{"role": "critic", "content": "?"}], "x")


def test_files_kto_and_dpo_columns(tmp_path: Path) -> None:
    trajectories = [traj("a", 0, True, turns=[turn(response="7")]), traj("a", 1, False, turns=[turn(response="8")])]
    kto = save_dataset(KTOSelector().select(trajectories, 0, 2048).samples, tmp_path / "kto", "kto")
    rows = json.loads((kto.directory / "train.json").read_text())
    assert sorted(r["kto_tag"] for r in rows) == [False, True]
    assert json.loads((kto.directory / "dataset_info.json").read_text())["baton_train"]["columns"]["kto_tag"]
    dpo = save_dataset(DPOSelector().select(trajectories, 0, 2048).samples, tmp_path / "dpo", "dpo")
    (row,) = json.loads((dpo.directory / "train.json").read_text())
    assert row["conversations"] == [{"from": "human", "value": "2+5?"}]
    assert row["chosen"] == {"from": "gpt", "value": "7"} and row["rejected"] == {"from": "gpt", "value": "8"}
    info = json.loads((dpo.directory / "dataset_info.json").read_text())["baton_train"]
    assert info["ranking"] is True and info["columns"]["rejected"] == "rejected"
    (ids,) = [json.loads(line) for line in (dpo.directory / "train.token_ids.jsonl").read_text().splitlines()]
    assert ids["rejected_source"] == "a#1@0" and ids["completion_token_ids"] == [4, 5]
    assert ids["completion_logprobs"] == [-0.5, -1.25] and ids["rejected_completion_logprobs"] == [-0.5, -1.25]


def test_each_row_carries_the_sampled_logprobs_aligned_or_none(tmp_path: Path) -> None:
    recorded = turn(response="7")
    recorded.completion_logprobs = [-0.125, -2.0]
    old = turn(response="8")
    old.completion_logprobs = None  # a journal from before the field, or policy_config.return_logprobs=false
    samples = RFTSelector().select([traj("a", 0, True, turns=[recorded]), traj("b", 0, True, turns=[old])], 0, 99)
    save_dataset(samples.samples, tmp_path, "sft")
    rows = [json.loads(line) for line in (tmp_path / "train.token_ids.jsonl").read_text().splitlines()]
    by_source = {r["source"]: r["completion_logprobs"] for r in rows}
    assert by_source == {"a#0@0": [-0.125, -2.0], "b#0@0": None}
    bad = turn(response="9")
    bad.completion_logprobs = [-0.125]
    samples = RFTSelector().select([traj("c", 0, True, turns=[bad])], 0, 99)
    with pytest.raises(ConfigError, match=r"c#0@0: completion_logprobs has 1 values for 2 completion_token_ids"):
        save_dataset(samples.samples, tmp_path / "bad", "sft")
    assert not (tmp_path / "bad").exists()


def test_validation_split_and_dropping_rows(tmp_path: Path) -> None:
    samples = RFTSelector().select([traj(f"t{i}", 0, True) for i in range(10)], 0, 2048).samples
    files = save_dataset(samples, tmp_path, "sft", val_split_ratio=0.2, seed=1)
    assert (files.train_rows, files.val_rows) == (8, 2) and files.names == ("baton_train", "baton_val")
    assert set(json.loads((tmp_path / "dataset_info.json").read_text())) == {"baton_train", "baton_val"}
    sources = [json.loads(line)["source"] for line in (tmp_path / "train.token_ids.jsonl").read_text().splitlines()]
    drop_rows(files, "train", [0, 3])
    left = [json.loads(line)["source"] for line in (tmp_path / "train.token_ids.jsonl").read_text().splitlines()]
    assert left == [s for i, s in enumerate(sources) if i not in (0, 3)] and files.train_rows == 6
    assert len(json.loads((tmp_path / "train.json").read_text())) == 6


def dataset_folder(tmp_path: Path) -> tuple[Path, Path]:
    data, recipe = tmp_path / "data", tmp_path / "train_config.yaml"
    save_dataset([multi_turn_sample()], data, "sft")
    recipe.write_text("stage: sft\n")
    return data, recipe


def test_dataset_digest_changes_with_any_file_or_the_yaml(tmp_path: Path) -> None:
    data, recipe = dataset_folder(tmp_path)
    first = dataset_digest(data, recipe)
    assert first == dataset_digest(data, recipe) and len(first) == 64
    recipe.write_text("stage: kto\n")
    assert dataset_digest(data, recipe) != first
    recipe.write_text("stage: sft\n")
    (data / "train.json").write_text((data / "train.json").read_text().replace("look", "seek"))
    assert dataset_digest(data, recipe) != first
    (data / "train.json").unlink()
    assert dataset_digest(data, recipe) != first


class StepClock:
    """training.update's `time` for one test: sleep() moves monotonic() on at once; `on_sleep` runs after
    each sleep (what the shared filesystem shows meanwhile). No real time passes."""

    def __init__(self, on_sleep: Callable[[float], object] = lambda now: None) -> None:
        self.now, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.on_sleep(self.now)


def test_a_node_trains_only_on_the_dataset_the_master_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = RunPaths(tmp_path)
    data, recipe = dataset_folder(tmp_path)
    wanted = dataset_digest(data, recipe)
    monkeypatch.setattr("training.update.time", clock := StepClock())
    wait_for_dataset(paths, wanted, wait_s=0)  # the same files: at once
    assert clock.sleeps == 0
    recipe.write_text("stage: kto\n")  # what this node sees differs: it looks again for wait_s, then stops naming both
    expected = f"has sha256 [0-9a-f]{{64}} on this node after 3 s, but the master prepared {wanted}"
    with pytest.raises(TrainingError, match=expected):
        wait_for_dataset(paths, wanted, wait_s=3, every_s=1)
    assert (clock.now, clock.sleeps) == (3, 3)  # looked at 0, 1, 2 and 3 s
    # the master's files show up late on this node (NFS attribute caching): it waits for them, and goes on at
    # the first look that sees them
    shows_up = StepClock(lambda now: now == 2 and recipe.write_text("stage: sft\n"))
    monkeypatch.setattr("training.update.time", shows_up)
    wait_for_dataset(paths, wanted, wait_s=5, every_s=1)
    assert shows_up.now == 2


class _OneTurn(Env):
    """One reply, then success: what the episode loop records is all this test looks at."""

    name = "one-turn"

    async def setup_state(self, task: Task, slot: int) -> EpisodeState:
        return EpisodeState(task=task, slot=slot, max_steps=1)

    def initial_messages(self, state: EpisodeState) -> list[Message]:
        return [{"role": "user", "content": "2+5?"}]

    async def env_response(self, state: EpisodeState, reply: str) -> StepResult:
        return StepResult(observation=None, done=True, action={"answer": reply})

    async def score(self, state: EpisodeState) -> Score:
        return Score(reward=1.0, success=True)


class _Thinking:
    async def chat(self, messages: list[Message]) -> Completion:
        return Completion("<think>\n2+5 is 7\n</think>\n\n7", "stop", 4, 9, [1, 2, 3, 4], list(range(9)))


async def test_a_thinking_reply_is_trained_whole_reasoning_and_ids_included(tmp_path: Path) -> None:
    """The environment saw `7`; the journal and the training row keep what the model sampled."""
    settings = SchedulerSettings(1, 5.0, 0, 0, "train", 0, 0, "p", reasoning="think")
    journal = Journal(tmp_path / "rank_0.jsonl", resume=False)
    await Scheduler(_OneTurn(), _Thinking(), journal, settings, Progress()).run([EpisodeSpec(Task("t", "t"), 0)])
    (trajectory,) = read_journal(tmp_path / "rank_0.jsonl")
    (step,) = trajectory.turns
    assert step.action == {"answer": "7"} and step.env_reply == "7"
    (sample,) = RFTSelector().select([trajectory], 0, 2048).samples
    row, ids = to_row(sample, "sft"), token_ids(sample)
    assert row["conversations"][-1] == {"from": "gpt", "value": "<think>\n2+5 is 7\n</think>\n\n7"}
    assert ids["completion_token_ids"] == list(range(9))
