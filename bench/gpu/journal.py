"""A baton.trajectory/1 journal of arithmetic episodes, tokenised with the model's own chat template.

The GPU check trains on it where no real journal travels. Each task has two successes (one
short, one long) and two failures, so every selection rule has something to choose from.
usage: python journal.py MODEL_DIR LOG_PATH [TASKS]   (writes trajectories/train/iter_0000/rank_0.jsonl)
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path


def episodes(tokenizer, tasks: int) -> list[dict]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(0)
    lines = []
    for t in range(tasks):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        messages = [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer.encode(text, add_special_tokens=False)  # what vLLM's chat endpoint does
        replies = [(str(a + b), True), (f"The answer is {a + b}.", True), (str(a + b + 1), False), (f"{a - b}", False)]
        for s, (reply, ok) in enumerate(replies):
            completion = [*tokenizer.encode(reply, add_special_tokens=False), eos]
            now = time.time()
            turn = {
                "index": 0, "messages": messages, "response": reply, "prompt_token_ids": prompt,
                "completion_token_ids": completion, "prompt_tokens": len(prompt), "completion_tokens": len(completion),
                "finish_reason": "stop", "action": {"answer": reply}, "invalid_action": False, "observation": None,
                "reward": float(ok), "state_changed": True, "images": [], "latency_s": 0.1,
            }  # fmt: skip
            lines.append({
                "schema": "baton.trajectory/1", "episode_id": f"gpu-{t:04d}#{s}", "task_id": f"gpu-{t:04d}",
                "sample_index": s, "split": "train", "iteration": 0, "rank": 0, "env": "reasoning_gym",
                "family": "basic_arithmetic", "difficulty": 1, "status": "ok", "error": None, "reward": float(ok),
                "success": ok, "policy_model": "policy", "policy_version": 0, "attempts": 1, "started_at": now,
                "finished_at": now + 0.5, "info": {}, "turns": [turn],
            })  # fmt: skip
    return lines


def main(model: Path, log_path: Path, tasks: int) -> None:
    from transformers import AutoTokenizer  # the train environment's, not the app environment's

    folder = log_path / "trajectories" / "train" / "iter_0000"
    folder.mkdir(parents=True, exist_ok=True)
    lines = episodes(AutoTokenizer.from_pretrained(model), tasks)
    (folder / "rank_0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} trajectories of {tasks} tasks to {folder}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 64)
