"""The per-iteration record, the success table and the plot built from metrics.jsonl and the run state."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.overrides import override_key
from coordinator.plot import format_table, save_plot
from coordinator.summary import iteration_records, summarize, summary_line


def write_metrics(log: Path, rows: list[dict]) -> None:
    log.mkdir(parents=True, exist_ok=True)
    with open(log / "metrics.jsonl", "a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def test_record_gathers_the_phases_of_its_iteration_only(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [
            {"kind": "rollout", "split": "train", "iteration": 1, "success_rate": 0.1, "ok_episodes": 64},
            {"kind": "rollout", "split": "train", "iteration": 2, "success_rate": 0.5, "ok_episodes": 64},
            {"kind": "rollout", "split": "test", "iteration": 1, "success_rate": 0.25, "ok_episodes": 8},
            {"kind": "training", "iteration": 1, "train_loss": 1.5, "steps": 2},
            {"kind": "promotion", "iteration": 1, "policy_version": 1},
        ],
    )
    state = tmp_path / "run" / "state" / "iter_0001"
    state.mkdir(parents=True)
    (state / "update.done").write_text("promoted v1\n")
    (state / "times").write_text("train_rollout 11\nupdate 200\nupdate 13\nbroken x\n")
    record = summarize(tmp_path, 1, None)
    assert (record["train_success_rate"], record["eval_success_rate"], record["train_loss"]) == (0.1, 0.25, 1.5)
    assert (record["promoted_version"], record["update"], record["served_version"]) == (1, "promoted v1", None)
    assert record["phase_s"] == {"train_rollout": 11.0, "update": 213.0}
    second = summarize(tmp_path, 2, 1)
    assert second["eval_success_rate"] is None and second["promoted_version"] is None and second["update"] is None


def test_record_carries_the_rollouts_reply_length_and_invalid_share(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [
            {"kind": "rollout", "split": "train", "iteration": 1, "mean_response_tokens": 30.0},
            {
                "kind": "rollout",
                "split": "train",
                "iteration": 1,
                "mean_response_tokens": 24.5,
                "invalid_action_rate": 0.05,
            },
            {
                "kind": "rollout",
                "split": "test",
                "iteration": 1,
                "mean_response_tokens": 26.25,
                "invalid_action_rate": 0.116,
            },
            {"kind": "rollout", "split": "test", "iteration": 2, "mean_response_tokens": 99.0},
        ],
    )
    record = summarize(tmp_path, 1, None)
    assert (record["train_mean_response_tokens"], record["eval_mean_response_tokens"]) == (24.5, 26.25)
    assert (record["train_invalid_action_rate"], record["eval_invalid_action_rate"]) == (0.05, 0.116)


def test_a_record_written_before_reply_statistics_gets_them_from_its_rollouts(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [
            {
                "kind": "rollout",
                "split": "test",
                "iteration": 1,
                "mean_response_tokens": 32.0,
                "invalid_action_rate": 0.1,
            },
            {"kind": "iteration", "iteration": 1, "train_success_rate": 0.2},
            {
                "kind": "iteration",
                "iteration": 2,
                "train_mean_response_tokens": 20.0,
                "eval_mean_response_tokens": None,
                "train_invalid_action_rate": 0.0,
                "eval_invalid_action_rate": None,
            },
            {"kind": "rollout", "split": "test", "iteration": 2, "mean_response_tokens": 50.0},
        ],
    )
    first, second = iteration_records(tmp_path)
    assert (first["eval_mean_response_tokens"], first["eval_invalid_action_rate"]) == (32.0, 0.1)
    assert first["train_mean_response_tokens"] is None and first["train_success_rate"] == 0.2
    assert second["eval_mean_response_tokens"] is None  # the record's own value wins over a later rollout line


def test_a_keep_best_revert_is_in_its_iterations_record_and_line(tmp_path: Path) -> None:
    write_metrics(tmp_path, [{"kind": "revert", "iteration": 2, "policy_version": 2, "reverted_to": 0}])
    record = summarize(tmp_path, 2, 1)
    assert (record["reverted_version"], record["reverted_to"]) == (2, 0)
    assert "; reverted to base as v2 (--keep-best); no phase timed" in summary_line(record)
    assert summarize(tmp_path, 1, None)["reverted_version"] is None


def test_serving_dtype_comes_from_the_masters_serving_record(tmp_path: Path) -> None:
    write_metrics(tmp_path, [])
    assert summarize(tmp_path, 1, None)["serving_dtype"] is None
    worker = tmp_path / "run" / "rank_1"
    worker.mkdir(parents=True)
    (worker / "serving.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert summarize(tmp_path, 1, None)["serving_dtype"] is None  # only rank 0's server is recorded
    master = tmp_path / "run" / "rank_0"
    master.mkdir(parents=True)
    (master / "serving.json").write_text(json.dumps({"dtype": "float32", "reason": "no native bf16"}))
    assert summarize(tmp_path, 2, None)["serving_dtype"] == "float32"


def test_the_last_record_of_an_iteration_wins_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [
            {"kind": "iteration", "iteration": 2, "train_success_rate": 0.1},
            {"kind": "iteration", "iteration": 1, "train_success_rate": 0.2},
            {"kind": "iteration", "iteration": 2, "train_success_rate": 0.3},
        ],
    )
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "iter')
    assert [(r["iteration"], r["train_success_rate"]) for r in iteration_records(tmp_path)] == [(1, 0.2), (2, 0.3)]


def test_a_record_summarized_after_a_torn_tail_is_kept(tmp_path: Path) -> None:
    write_metrics(tmp_path, [{"kind": "rollout", "split": "train", "iteration": 1, "success_rate": 0.5}])
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "training", "iter')  # a writer killed mid-line
    summarize(tmp_path, 1, None)
    assert [(r["iteration"], r["train_success_rate"]) for r in iteration_records(tmp_path)] == [(1, 0.5)]


def test_an_iteration_is_recorded_once_though_summarized_again_on_resume(tmp_path: Path) -> None:
    """A run that wrote the record and died before the iteration's end marker (a full disk did it in the
    chaos soak) summarizes again on --resume: the record it wrote comes back, nothing is appended."""
    write_metrics(tmp_path, [{"kind": "rollout", "split": "train", "iteration": 1, "success_rate": 0.5}])
    first = summarize(tmp_path, 1, None)
    write_metrics(tmp_path, [{"kind": "rollout", "split": "train", "iteration": 1, "success_rate": 0.9}])
    again = summarize(tmp_path, 1, None)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines].count("iteration") == 1
    assert again == first and again["train_success_rate"] == 0.5


def test_table_and_plot(tmp_path: Path) -> None:
    write_metrics(
        tmp_path,
        [
            {
                "kind": "iteration",
                "iteration": 1,
                "served_version": None,
                "train_success_rate": 0.109,
                "eval_success_rate": 0.016,
                "train_loss": None,
                "update": "failed (exit 2)",
                "train_mean_response_tokens": 24.04,
                "eval_mean_response_tokens": 26.0,
                "train_invalid_action_rate": 0.03,
                "eval_invalid_action_rate": 0.125,
            },
            {
                "kind": "iteration",
                "iteration": 2,
                "served_version": 1,
                "train_success_rate": 0.094,
                "eval_success_rate": None,
                "train_loss": 1.714,
                "update": "promoted v2",
            },
        ],
    )
    lines = format_table(tmp_path).splitlines()
    header = ["iter", "policy", "train", "eval", "tok_tr", "tok_ev", "inv_tr", "inv_ev", "loss", "update"]
    assert lines[0].split() == header
    assert lines[1].split() == [
        "1",
        "base",
        "10.9%",
        "1.6%",
        "24.0",
        "26.0",
        "3.0%",
        "12.5%",
        "-",
        "failed",
        "(exit",
        "2)",
    ]
    assert lines[2].split() == ["2", "v1", "9.4%", "-", "-", "-", "-", "-", "1.714", "promoted", "v2"]
    assert lines[3].startswith("tok_tr / tok_ev: mean reply tokens")
    path = save_plot(tmp_path)
    assert path == tmp_path / "plots" / "success.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert not list(path.parent.glob(".success.*"))


def test_override_key() -> None:
    assert override_key("+a.b=1") == "a.b"
    assert override_key("~env_config.x") == "env_config.x"
    assert override_key("++x=1") == "x"
    assert override_key("env=textworld") == "env"
