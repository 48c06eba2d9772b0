"""The rollout engine end to end on the real vLLM and the default model.

reasoning_gym and judged (the same vLLM as judge) roll out a handful of
episodes; a SIGKILLed rollout resumed gives the same episodes as an
uninterrupted one with no duplicates; SIGINT exits non-zero leaving no child.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.rollout_cli import engine_env, journal_rows, last_metrics, rollout_cmd, run_rollout

pytestmark = pytest.mark.e2e


def test_reasoning_gym_rollout_writes_journal_manifest_metrics(vllm_server, data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    out = run_rollout(
        rollout_cmd(
            "rollout_test",
            data_dir,
            log,
            vllm_server.base_url,
            "env_config.test_tasks_rollout_size=6",
            "policy_config.max_new_tokens=16",
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = journal_rows(log)
    assert len(rows) == 6 and len({r["episode_id"] for r in rows}) == 6
    for row in rows:
        assert row["schema"] == "baton.trajectory/1" and row["status"] == "ok"
        (turn,) = row["turns"]
        assert turn["messages"][-1]["content"].endswith("Answer with only the final number.")
        assert turn["prompt_token_ids"] and len(turn["prompt_token_ids"]) == turn["prompt_tokens"]
        assert turn["completion_token_ids"] and len(turn["completion_token_ids"]) == turn["completion_tokens"]
        # the sampled tokens' log-probabilities (policy_config.return_logprobs, default on): one per reply id,
        # each a finite log-probability, and not all 0 (at temperature 1 a 16-token reply is no certainty)
        logprobs = turn["completion_logprobs"]
        assert len(logprobs) == len(turn["completion_token_ids"])
        assert all(math.isfinite(lp) and -100 < lp <= 0 for lp in logprobs), logprobs
        assert sum(logprobs) < 0
        assert row["success"] == (row["reward"] >= 1.0)
    iter_dir = log / "trajectories" / "test" / "iter_0000"
    manifest = json.loads((iter_dir / "rank_0.manifest.json").read_text())
    assert manifest["episodes"] == 6 and manifest["complete"] is True
    assert manifest["sha256"] == hashlib.sha256((iter_dir / "rank_0.jsonl").read_bytes()).hexdigest()
    metrics = last_metrics(log)
    assert metrics["kind"] == "rollout" and metrics["episodes"] == 6
    assert metrics["success_rate"] == round(sum(r["success"] for r in rows) / 6, 4)
    assert (iter_dir / "rank_0.config.yaml").exists()
    assert json.loads((log / "status.json").read_text())["finished"] == 6


def test_judged_rollout_with_local_judge(vllm_server, tmp_path: Path) -> None:
    """The policy server judges (openai_config.constrain_verdict=auto: vLLM's structured-outputs regex), so every
    reply ends in a verdict: no judge_error. The default model is a poor judge (measured, 96 calls each: SUCCESS
    to 44 % of right answers and 19 % of wrong ones), so the judge samples (temperature 1): over 32 episodes both
    verdicts come back (all FAILURE: at most 0.81**32, about 1e-3), and each is recorded as the episode's success."""
    data, log = tmp_path / "data", tmp_path / "log"
    (data / "tasks").mkdir(parents=True)
    tasks = [
        {
            "task_id": "w1",
            "task_name": "What is the capital of France?",
            "website": "https://en.wikipedia.org",
            "domain": "reference",
            "subdomain": "geo",
            "difficulty": 2,
            "evaluator_reference": [{"description": "The answer names Paris", "difficulty": 1}],
            "definite_answer": "Paris",
        },
        {
            "task_id": "w2",
            "task_name": "How many days are in a week?",
            "website": "https://www.timeanddate.com",
            "domain": "reference",
            "subdomain": "time",
            "difficulty": 5,
            "evaluator_reference": "The answer is 7",
            "definite_answer": "7",
        },
    ]
    (data / "tasks" / "test.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = run_rollout(
        rollout_cmd(
            "rollout_test",
            data,
            log,
            vllm_server.base_url,
            "env=judged",
            "env_config.n_samples_per_task=16",
            "policy_config.max_new_tokens=48",
            "openai_config.max_retries=0",  # a reply without a verdict would be a judge_error at once
            "openai_config.max_tokens=48",
            "openai_config.temperature=1.0",
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = journal_rows(log)
    assert sorted(r["episode_id"] for r in rows) == sorted(f"{t}#{i}" for t in ("w1", "w2") for i in range(16))
    verdicts = []
    for row in rows:
        assert row["status"] == "ok", row["error"]
        verdict = re.search(r"Verdict: (SUCCESS|FAILURE)$", row["info"]["judge"])  # the judge's own reply
        assert verdict, row["info"]["judge"]
        # an answer cut at max_new_tokens is no success, whatever the judge says (docs/rollout.md, thinking models)
        cut = row["turns"][-1]["finish_reason"] == "length"
        assert row["success"] is (verdict.group(1) == "SUCCESS" and not cut) and row["reward"] == float(row["success"])
        assert bool(row["info"].get("truncated")) is cut
        verdicts.append(verdict.group(1))
    assert set(verdicts) == {"SUCCESS", "FAILURE"}, verdicts
    metrics = last_metrics(log)
    assert metrics["ok_episodes"] == 32 and "judge_error" not in metrics["failures"]
    assert metrics["success_rate"] == round(sum(row["success"] for row in rows) / 32, 4)


def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        assert proc.poll() is None, "the rollout ended before it could be interrupted"
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


#: one episode at a time, so that the rollout is still running when the test kills it
SLOW = (
    "env_config.server_size=1",
    "env_config.max_vllm_sessions=1",
    "policy_config.max_new_tokens=24",
    "env_config.train_tasks_rollout_size=8",
    "env_config.n_samples_per_task=2",
)


def test_resume_after_sigkill_matches_uninterrupted_run(vllm_server, data_dir: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    # the same tasks and samples, all at once: only its episode ids are compared, and the serving does not choose them
    at_once = [arg for arg in SLOW if not arg.startswith(("env_config.server_size", "env_config.max_vllm_sessions"))]
    out = run_rollout(rollout_cmd("rollout_train", data_dir, reference, vllm_server.base_url, *at_once))
    assert out.returncode == 0, out.stderr[-3000:]
    expected = sorted(r["episode_id"] for r in journal_rows(reference, "train"))
    assert len(expected) == 16

    log = tmp_path / "log"
    cmd = rollout_cmd("rollout_train", data_dir, log, vllm_server.base_url, *SLOW)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=engine_env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    journal = log / "trajectories" / "train" / "iter_0000" / "rank_0.jsonl"
    try:
        _wait_for_lines(journal, 3, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    partial = journal_rows(log, "train")
    assert 3 <= len(partial) < 16
    out = run_rollout([*cmd, "resume=true"])
    assert out.returncode == 0, out.stderr[-3000:]
    ids = [r["episode_id"] for r in journal_rows(log, "train")]
    assert len(ids) == len(set(ids)), "no duplicates"
    assert sorted(ids) == expected, "the same episodes as the uninterrupted run"
    assert ids[: len(partial)] == [r["episode_id"] for r in partial], "journaled episodes were kept, not redone"


def test_sigint_stops_seals_and_leaves_no_child(vllm_server, data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    cmd = rollout_cmd("rollout_train", data_dir, log, vllm_server.base_url, *SLOW)
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=engine_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = log / "trajectories" / "train" / "iter_0000" / "rank_0.jsonl"
    try:
        _wait_for_lines(journal, 1, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "resume=true" in err
    assert _group_alive(proc.pid) == []
    manifest = json.loads((journal.parent / "rank_0.manifest.json").read_text())
    assert manifest["complete"] is False and manifest["episodes"] == len(journal_rows(log, "train")) < 16
    assert last_metrics(log)["interrupted"] == "SIGINT"
