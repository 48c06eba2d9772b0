"""A finished train rollout written without a server: single-turn sums, one right and one wrong reply per task, with
the token ids the model's own chat template gives (what vLLM reports). What an update trains on when a benchmark or
a test wants no rollout: bench/update_overhead.py, tests/e2e/update_in_process.py.
"""

from __future__ import annotations

from pathlib import Path

from rollout_engine.journal import Journal
from rollout_engine.types import Trajectory, Turn


def write_sum_rollout(tokenizer, journal: Path, iteration: int, tasks: int, addend: int) -> None:
    """`tasks` tasks "What is <task> + <addend>?" at `journal` (a rank's journal, sealed): for each, a success
    (sample 0) and a failure (sample 1, one more than the sum)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = Journal(journal, resume=False)
    for task in range(tasks):
        messages = [{"role": "user", "content": f"What is {task} + {addend}? Answer with the number only."}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for sample, (reply, success) in enumerate(((str(task + addend), True), (str(task + addend + 1), False))):
            turn = Turn(
                index=0,
                messages=messages,
                response=reply,
                prompt_token_ids=tokenizer.encode(prompt, add_special_tokens=False),
                completion_token_ids=[*tokenizer.encode(reply, add_special_tokens=False), end],
                finish_reason="stop",
            )
            out.append(
                Trajectory(
                    episode_id=f"t{task}#{sample}",
                    task_id=f"t{task}",
                    sample_index=sample,
                    split="train",
                    iteration=iteration,
                    rank=0,
                    env="reasoning_gym",
                    family="chain_sum",
                    difficulty=1,
                    reward=float(success),
                    success=success,
                    turns=[turn],
                )
            )
    out.seal(planned=2 * tasks)
