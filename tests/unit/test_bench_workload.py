"""Logic of the benchmarks around the real parts: the seeded workload, the reply budget
handed to the policy client, and the lockstep baseline's barrier (a scripted policy stands in
for vLLM; the benchmarks themselves run against a real server)."""

from __future__ import annotations

import asyncio
import dataclasses

from bench.lockstep import run_lockstep
from bench.workload import REPLY_BUDGET, BudgetedPolicy, LatencyEnv, Workload, make_tasks, plan_episode
from rollout_engine.config import PolicyConfig
from rollout_engine.types import Completion

FAST = Workload(seed=3, min_turns=1, max_turns=5, latency_median_s=0.001, latency_cap_s=0.005)


class RecordingPolicy:
    """Answers at once and records (task id, turn, reply budget) of every request, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    async def chat(self, messages):
        task_id = messages[0]["content"].split("Task ")[1].split(":")[0]
        turn = sum(m["role"] == "assistant" for m in messages)
        self.calls.append((task_id, turn, REPLY_BUDGET.get()))
        await asyncio.sleep(0)
        return Completion(text="click", completion_tokens=REPLY_BUDGET.get())


def test_plan_is_a_function_of_seed_and_task_and_stays_in_bounds():
    workload = Workload(seed=7)
    plans = [plan_episode(workload, f"t{i}") for i in range(200)]
    assert plans == [plan_episode(workload, f"t{i}") for i in range(200)]
    assert plans != [plan_episode(dataclasses.replace(workload, seed=8), f"t{i}") for i in range(200)]
    for plan in plans:
        assert workload.min_turns <= plan.turns <= workload.max_turns
        assert len(plan.reply_tokens) == plan.turns
        assert all(0 <= s <= workload.latency_cap_s for s in plan.latencies_s)
        assert all(1 <= n <= workload.reply_cap_tokens for n in plan.reply_tokens)
    latencies = sorted(s for p in plans for s in p.latencies_s)
    # heavy tail: the slowest step is many times the median one
    assert latencies[-1] > 8 * latencies[len(latencies) // 2]


async def test_engine_episode_loop_plays_the_plan_with_its_reply_budgets():
    env, policy = LatencyEnv(FAST), RecordingPolicy()
    task = make_tasks(1)[0]
    plan = plan_episode(FAST, task.task_id)
    state, score = await env.run_episode(task, 0, policy)
    assert len(state.turns) == plan.turns and score.success
    assert [budget for _, _, budget in policy.calls] == list(plan.reply_tokens)


def test_budgeted_policy_sends_the_budget_as_exact_length():
    policy = BudgetedPolicy(PolicyConfig(max_new_tokens=256), 4, client=object())
    token = REPLY_BUDGET.set(37)
    try:
        args = policy.request_args([{"role": "user", "content": "hi"}])
    finally:
        REPLY_BUDGET.reset(token)
    assert args["max_tokens"] == 37
    assert args["extra_body"] == {"return_token_ids": True, "min_tokens": 37}


async def test_lockstep_turn_k_waits_for_turn_k_of_the_whole_batch():
    env, policy = LatencyEnv(FAST), RecordingPolicy()
    tasks = make_tasks(7)
    states = await run_lockstep(env, policy, tasks, batch_size=4)
    assert [s.task.task_id for s in states] == [t.task_id for t in tasks]
    batches = [{t.task_id for t in tasks[:4]}, {t.task_id for t in tasks[4:]}]
    first_of_second = next(i for i, (task_id, _, _) in enumerate(policy.calls) if task_id in batches[1])
    assert all(task_id in batches[0] for task_id, _, _ in policy.calls[:first_of_second])
    assert all(task_id in batches[1] for task_id, _, _ in policy.calls[first_of_second:])
    for part in (policy.calls[:first_of_second], policy.calls[first_of_second:]):
        turns = [turn for _, turn, _ in part]
        assert turns == sorted(turns), "a turn started before the previous turn of the batch ended"
    for state in states:
        plan = plan_episode(FAST, state.task.task_id)
        assert len(state.turns) == plan.turns
        assert [b for task_id, _, b in policy.calls if task_id == state.task.task_id] == list(plan.reply_tokens)
