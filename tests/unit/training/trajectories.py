"""Tiny trajectory builders for the training unit tests."""

from __future__ import annotations

from rollout_engine.types import Failure, Trajectory, Turn


def turn(index: int = 0, response: str = "7", changed: bool = True, prompt: str = "2+5?") -> Turn:
    return Turn(
        index=index,
        messages=[{"role": "user", "content": prompt}],
        response=response,
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        completion_logprobs=[-0.5, -1.25],
        state_changed=changed,
    )


def traj(
    task: str,
    sample: int,
    success: bool,
    iteration: int = 0,
    turns: list[Turn] | None = None,
    status: Failure = Failure.OK,
) -> Trajectory:
    return Trajectory(
        episode_id=f"{task}#{sample}",
        task_id=task,
        sample_index=sample,
        split="train",
        iteration=iteration,
        rank=0,
        env="reasoning_gym",
        family="chain_sum",
        difficulty=1,
        status=status,
        reward=float(success),
        success=success,
        turns=turns if turns is not None else [turn()],
    )
