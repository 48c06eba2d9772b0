"""Write a real trajectory journal by calling a real vLLM server (test helper).

Until the rollout engine drives these tests, this produces single-turn
reasoning-gym episodes the way the engine records them: the chat messages sent,
the reply text, and the prompt/completion token ids vLLM reports
(`return_token_ids`), scored by the first number in the reply.

    write_journal(base_url, model, tasks_file, log_path, iteration=0, n_tasks=8, n_samples=4)
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rollout_engine.types import Failure, Task, Trajectory, Turn

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SUFFIX = "\nAnswer with only the final number."
NUMBER = re.compile(r"-?\d+")


def chat(base_url: str, model: str, messages: list[dict], max_tokens: int = 32, seed: int | None = None) -> dict:
    """One chat completion with token ids (plain HTTP, no client library)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
            "return_token_ids": True}
    if seed is not None:
        body["seed"] = seed
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def episode(base_url: str, model: str, task: Task, sample: int, iteration: int, system: bool) -> Trajectory:
    """One single-turn episode."""
    messages = ([{"role": "system", "content": SYSTEM}] if system else []) + [
        {"role": "user", "content": task.task_name + SUFFIX}]
    started = time.time()
    reply = chat(base_url, model, messages, seed=iteration * 1000 + sample)
    choice = reply["choices"][0]
    text = choice["message"]["content"] or ""
    found = NUMBER.search(text)
    success = found is not None and found.group(0) == str(task.definite_answer)
    turn = Turn(index=0, messages=messages, response=text, prompt_token_ids=reply.get("prompt_token_ids"),
                completion_token_ids=choice.get("token_ids"), prompt_tokens=reply["usage"]["prompt_tokens"],
                completion_tokens=reply["usage"]["completion_tokens"], finish_reason=choice["finish_reason"],
                action={"answer": found.group(0) if found else None}, reward=float(success))
    return Trajectory(episode_id=f"{task.task_id}#{sample}", task_id=task.task_id, sample_index=sample,
                      split="train", iteration=iteration, rank=0, env=task.env, family=task.family,
                      difficulty=task.difficulty, status=Failure.OK, reward=float(success), success=success,
                      turns=[turn], policy_model=model, started_at=started, finished_at=time.time())


def write_journal(base_url: str, model: str, tasks_file: Path, log_path: Path, iteration: int = 0,
                  n_tasks: int = 8, n_samples: int = 4, system: bool = True) -> list[Trajectory]:
    """Roll out `n_tasks` x `n_samples` episodes and write rank_0.jsonl plus its manifest."""
    lines = [json.loads(line) for line in tasks_file.read_text().splitlines() if line.strip()]
    tasks = [Task.from_json(row) for row in lines[:n_tasks]]
    jobs = [(task, sample) for task in tasks for sample in range(n_samples)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        trajectories = list(pool.map(lambda job: episode(base_url, model, job[0], job[1], iteration, system), jobs))
    directory = log_path / "trajectories" / "train" / f"iter_{iteration:04d}"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "rank_0.jsonl", "w") as out:
        for trajectory in trajectories:
            out.write(json.dumps(trajectory.to_json()) + "\n")
    (directory / "rank_0.manifest.json").write_text(json.dumps({"trajectories": len(trajectories)}))
    return trajectories
