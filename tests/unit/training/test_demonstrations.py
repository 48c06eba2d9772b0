"""data.demonstrations: loading (strict), token counts, mixing into the selection, the dataset's rows, config checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_engine.errors import ConfigError
from rollout_engine.types import DEMONSTRATIONS_FILE, Trajectory, Turn
from tests.unit.training.test_config import load
from tests.unit.training.trajectories import traj, turn
from training.config import validate
from training.dataset import save_dataset, to_row
from training.demonstration_files import check_demonstrations, load_demonstrations
from training.demonstrations import add_demonstrations, count_tokens
from training.selection import KTOSelector, RFTSelector


def demo(task: str, turns: int = 2, success: bool = True, prompt: str = "") -> Trajectory:
    """An expert trajectory as python -m rollout_engine.demonstrations writes it: no ids, no counts."""
    steps = [turn(i, response=f"step {i}", prompt=prompt or f"{task} obs {i}") for i in range(turns)]
    out = traj(task, 0, success, turns=steps)
    for step in out.turns:
        step.prompt_token_ids = step.completion_token_ids = step.completion_logprobs = None
    out.policy_model = "expert:script"
    return out


def write(folder: Path, trajectories: list[Trajectory], extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / DEMONSTRATIONS_FILE
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories) + extra)
    return path


def test_a_folder_or_its_file_loads_and_relative_images_become_absolute(tmp_path: Path) -> None:
    shot = demo("m")
    shot.turns[0].images = ["images/m#0/step_000.png"]
    file = write(tmp_path / "d", [shot, demo("n")])
    loaded = load_demonstrations([str(tmp_path / "d"), str(file)])
    assert [t.task_id for t in loaded] == ["m", "n", "m", "n"]
    assert loaded[0].turns[0].images == [str(tmp_path / "d" / "images/m#0/step_000.png")]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('{"episode_id": "x", \n', f'{DEMONSTRATIONS_FILE}:2 is not JSON (got \'{{"episode_id": "x", \')'),
        ("[1, 2]\n", f"{DEMONSTRATIONS_FILE}:2 is not a baton.trajectory/1 line (a JSON list, not an object)"),
        ('{"schema": "baton.trajectory/1"}\n', ":2 is not a baton.trajectory/1 line (missing field 'status')"),
    ],
)
def test_a_malformed_line_names_file_line_and_fix(tmp_path: Path, extra: str, needle: str) -> None:
    write(tmp_path / "d", [demo("m")], extra)
    with pytest.raises(ConfigError) as err:
        load_demonstrations([str(tmp_path / "d")])
    assert needle in str(err.value) and "python -m rollout_engine.demonstrations" in str(err.value)


def test_missing_or_relative_paths_are_config_problems(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    problems = check_demonstrations([str(tmp_path / "nope"), str(tmp_path / "empty"), "demos"])
    assert len(problems) == 3
    assert f"data.demonstrations: '{tmp_path / 'nope'}' does not exist; point it at a folder" in problems[0]
    assert "is a folder without demonstrations.jsonl" in problems[1]
    assert "data.demonstrations must hold absolute paths (got 'demos'); pass /abs/path/to/demos" in problems[2]


def test_update_config_takes_a_path_or_a_list_and_refuses_dpo(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    write(tmp_path / "d", [demo("m")])
    assert load(tmp_path).data.demonstrations == []
    one = load(tmp_path, f"data.demonstrations={tmp_path / 'd'}")
    assert one.data.demonstrations == [str(tmp_path / "d")]
    validate(one)
    assert (
        load(tmp_path, f"data.demonstrations=[{tmp_path / 'd'},{tmp_path / 'd'}]").data.demonstrations
        == [str(tmp_path / "d")] * 2
    )
    with pytest.raises(ConfigError, match="algorithm=dpo pairs sampled replies only; use algorithm=rft"):
        validate(load(tmp_path, f"data.demonstrations={tmp_path / 'd'}", "algorithm=dpo"))
    with pytest.raises(ConfigError, match=r"data.demonstration_samples must be -1 \(no limit\) or >= 0 \(got -2\)"):
        validate(load(tmp_path, "data.demonstration_samples=-2"))


class WordTokenizer:
    """One token per word; the chat template adds 3 per message and 2 for the generation prompt."""

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
        assert kwargs == {"add_generation_prompt": True, "tokenize": False}
        return " ".join(f"<s> {m['role']} {m['content']} </s>" for m in conversation) + " <s> assistant"

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return [0] * len(text.split())


def test_token_counts_are_filled_only_where_ids_are_missing() -> None:
    demos = [demo("m", turns=1), traj("s", 0, True)]
    count_tokens(demos, WordTokenizer())
    assert (demos[0].turns[0].prompt_tokens, demos[0].turns[0].completion_tokens) == (
        3 + 3 + 2,
        2,
    )  # "m obs 0", the message's 3, the prompt's 2
    assert (demos[1].turns[0].prompt_tokens, demos[1].turns[0].completion_tokens) == (0, 0)  # sampled: ids count


def test_rft_mixes_demonstration_steps_under_the_same_rules_with_a_cap() -> None:
    sampled = [traj("a", 0, True), traj("b", 0, False)]
    demos = [demo("m"), demo("n", turns=3), demo("x", success=False)]
    demos[1].turns[0].state_changed = False
    demos[1].turns[1].response = " ".join(["w"] * 3000)  # over the cutoff
    count_tokens(demos, WordTokenizer())
    selector = RFTSelector()
    selection = selector.select(sampled, iteration=3, cutoff_len=2048)
    add_demonstrations(selection, demos, selector, 3, 2048, max_samples=-1, stage="sft")
    assert [s.source for s in selection.samples] == ["a#0@0", "demo:m#0@0", "demo:m#0@1", "demo:n#0@2"]
    assert selection.demonstrations == 3 and all(s.iteration == 3 for s in selection.samples if s.demonstration)
    assert selection.filtered == {
        "not_successful": 1,
        "demonstration_not_successful": 1,
        "demonstration_unchanged_state": 1,
        "demonstration_over_cutoff": 1,
    }
    assert "4 samples (3 of them demonstration steps) from 2 trajectories" in selection.describe()
    capped = selector.select(sampled, iteration=3, cutoff_len=2048)
    add_demonstrations(capped, demos, selector, 3, 2048, max_samples=1, stage="sft")
    assert capped.demonstrations == 1 and capped.filtered["demonstration_over_demonstration_samples"] == 2
    assert capped.samples[0].source == "a#0@0" and capped.samples[1].demonstration


def test_kto_demonstration_steps_are_desirable() -> None:
    selector = KTOSelector()
    selection = selector.select([traj("b", 0, False)], iteration=0, cutoff_len=2048)
    add_demonstrations(selection, [demo("m", turns=1)], selector, 0, 2048, max_samples=-1, stage="kto")
    assert [(s.source, s.label) for s in selection.samples] == [("b#0@0", False), ("demo:m#0@0", True)]


def test_demonstration_rows_are_rendered_like_sampled_rows_and_marked_in_the_token_ids(tmp_path: Path) -> None:
    selector = RFTSelector()
    selection = selector.select([traj("a", 0, True)], iteration=0, cutoff_len=2048)
    expert = demo("a", turns=1, prompt="2+5?")
    expert.turns[0].response = "7"  # the same step as the sampled one, written by an expert
    add_demonstrations(selection, [expert], selector, 0, 2048, max_samples=-1, stage="sft")
    sampled, demonstrated = selection.samples
    assert to_row(demonstrated, "sft") == to_row(sampled, "sft")
    save_dataset(selection.samples, tmp_path, "sft")
    ids = [json.loads(line) for line in (tmp_path / "train.token_ids.jsonl").read_text().splitlines()]
    by_source = {row["source"]: row for row in ids}
    assert by_source["demo:a#0@0"] == {
        "source": "demo:a#0@0",
        "prompt_token_ids": None,
        "completion_token_ids": None,
        "completion_logprobs": None,
        "demonstration": True,
    }
    assert "demonstration" not in by_source["a#0@0"]


def test_turns_round_trip_without_ids() -> None:
    step = Turn(index=0, messages=[{"role": "user", "content": "hi"}], response="click(e4)")
    assert Trajectory.from_json(traj("t", 0, True, turns=[step]).to_json()).turns[0].prompt_token_ids is None
