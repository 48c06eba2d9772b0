"""Sample selection: which policy steps the update trains on.

Selectors are chosen by Hydra `_target_` (configs/algorithm/*.yaml):

- `RFTSelector` (stage sft, WebGym's filtered behaviour cloning): the steps of
  successful trajectories, drawn with a per-iteration recency bias.
- `KTOSelector` (stage kto): steps of successful trajectories are desirable,
  steps of failed ones undesirable.
- `DPOSelector` (stage dpo): the first step of a successful and of a failed
  sample of the same task (same iteration, same prompt) make a pair.
- `GroupSelector` (algorithm=grpo, stage sft with the policy-gradient loss):
  every step of every episode of the (iteration, task) groups whose rewards
  differ, successes and failures, each carrying its episode's advantage
  (training.advantages); the other groups are dropped and counted.

Every selector drops infrastructure-failed trajectories (status other than
`ok`) and empty ones, optionally keeps only tasks whose samples disagree, skips
steps after which the environment did not change (never the last step), and
steps that would not fit `cutoff_len` or that carry literal media placeholders
(`<image>` in a text-only sample would make LLaMA-Factory expect an image).
`Selection.filtered` counts what each rule removed. Pure Python.

    selection = RFTSelector(positive_samples_to_train=64).select(trajectories, iteration=5, cutoff_len=2048)
"""

from __future__ import annotations

import logging
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from rollout_engine.images import count_images
from rollout_engine.types import Failure, Message, Trajectory, Turn
from training.advantages import episode_return, group_advantages

log = logging.getLogger(__name__)

MEDIA_PLACEHOLDERS = ("<image>", "<video>", "<audio>")


@dataclass
class Sample:
    """One training example made from one policy step."""

    episode_id: str
    task_id: str
    iteration: int
    turn_index: int
    messages: list[Message]
    response: str
    images: list[str] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    #: the policy's log-probability of each sampled reply token, 1:1 with completion_token_ids (None: not recorded)
    completion_logprobs: list[float] | None = None
    #: KTO: desirable (True) or undesirable (False)
    label: bool | None = None
    #: DPO: the failed step answering the same prompt
    rejected: Sample | None = None
    #: an expert's step (data.demonstrations), not a sampled one: it has no token ids
    demonstration: bool = False
    #: the task's family (Trajectory.family): what `balance_families` balances
    family: str = ""
    #: algorithm=grpo: the episode's reward normalised within its task's group (training.advantages)
    advantage: float | None = None

    @property
    def source(self) -> str:
        return f"{'demo:' if self.demonstration else ''}{self.episode_id}@{self.turn_index}"


@dataclass
class Selection:
    """The chosen samples and how many each rule removed (trajectories, groups or steps)."""

    samples: list[Sample]
    filtered: dict[str, int]
    trajectories: int
    #: how many of the samples are demonstration steps (training.demonstrations)
    demonstrations: int = 0

    def describe(self) -> str:
        rules = ", ".join(f"{rule}: {count}" for rule, count in self.filtered.items()) or "none"
        demos = f" ({self.demonstrations} of them demonstration steps)" if self.demonstrations else ""
        return (
            f"{len(self.samples)} samples{demos} from {self.trajectories} trajectories; filtered out by rule: {rules}"
        )


@dataclass
class _Rules:
    """The rules every selector shares."""

    last_k_iterations: int = 4
    disagreement_filter: bool = False
    skip_unchanged_steps: bool = True
    seed: int = 0

    def usable_trajectories(self, trajectories: list[Trajectory], filtered: Counter[str]) -> list[Trajectory]:
        """Drop infra failures and empty trajectories, then (optionally) agreeing groups."""
        kept = []
        for traj in trajectories:
            if traj.status is not Failure.OK:
                filtered["infra_failed"] += 1
            elif not traj.turns:
                filtered["empty"] += 1
            else:
                kept.append(traj)
        if not self.disagreement_filter:
            return kept
        groups: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
        for traj in kept:
            groups[(traj.iteration, traj.task_id)].append(traj)
        out = []
        for group in groups.values():
            if len({t.success for t in group}) > 1:
                out.extend(group)
            else:
                filtered["no_disagreement"] += len(group)
        return out

    def steps(self, traj: Trajectory, cutoff_len: int, filtered: Counter[str]) -> list[Sample]:
        """The trainable steps of one trajectory."""
        out = []
        for turn in traj.turns:
            last = turn is traj.turns[-1]
            if self.skip_unchanged_steps and not turn.state_changed and not last:
                filtered["unchanged_state"] += 1
            elif _length(turn) + 2 > cutoff_len:  # + the end-of-turn tokens the sampler may not emit
                filtered["over_cutoff"] += 1
            elif _has_placeholder(turn):
                filtered["media_placeholder"] += 1
            else:
                out.append(_sample(traj, turn))
        return out

    def rng(self, iteration: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + iteration)

    def window(self, trajectories: list[Trajectory], iteration: int, filtered: Counter[str]) -> list[Trajectory]:
        """Only the last K iterations up to `iteration` (the loader usually did this already)."""
        oldest = iteration - self.last_k_iterations + 1
        inside = [t for t in trajectories if oldest <= t.iteration <= iteration]
        if len(inside) < len(trajectories):
            filtered["outside_window"] += len(trajectories) - len(inside)
        return inside


@dataclass
class RFTSelector(_Rules):
    """Filtered behaviour cloning on the steps of successful trajectories.

    Recency weighting is per iteration: with current iteration N and window K,
    every step from iteration `it` (N-K < it <= N) has weight
    `(K - (N - it)) ** recency_bias_power` (newest K**p, oldest in the window
    1). Steps are drawn without replacement (Efraimidis-Spirakis keys), so an
    iteration's expected share of the draw is proportional to its step count
    times its weight. Power 0 draws uniformly. WebGym instead weighted each
    step by its position in the concatenated list, a per-sample bias.
    With `balance_families` each step's weight is also divided by its family's
    step count in the pool: every family's expected share is the same, so the
    families the policy has mastered (many successes) do not crowd out the ones
    it rarely solves.
    """

    positive_samples_to_train: int = 1800
    recency_bias_power: float = 2.0
    #: keep at most this many successes per task and iteration, those with the fewest reply tokens (0 = all;
    #: a run's default is configs/algorithm/rft.yaml's 1)
    shortest_per_task: int = 0
    balance_families: bool = False

    def weight(self, step_iteration: int, iteration: int) -> float:
        return float(self.last_k_iterations - (iteration - step_iteration)) ** self.recency_bias_power

    def select(self, trajectories: list[Trajectory], iteration: int, cutoff_len: int) -> Selection:
        filtered: Counter[str] = Counter()
        window = self.window(trajectories, iteration, filtered)
        successes: list[Trajectory] = []
        for traj in self.usable_trajectories(window, filtered):
            if not traj.success:
                filtered["not_successful"] += 1
            else:
                successes.append(traj)
        eligible: list[Sample] = []
        for traj in self.shortest(successes, filtered):
            eligible.extend(self.steps(traj, cutoff_len, filtered))
        chosen = self.draw(eligible, iteration)
        return Selection(chosen, dict(filtered), len(trajectories))

    def shortest(self, successes: list[Trajectory], filtered: Counter[str]) -> list[Trajectory]:
        """With `shortest_per_task` k: the k successes of each (iteration, task) with the fewest reply tokens.

        Against length drift: RFT on every success favours the longer replies a task happens to draw,
        and replies grow from one iteration to the next. Ties go to the lower episode id.
        """
        if not self.shortest_per_task:
            return successes
        groups: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
        for traj in successes:
            groups[(traj.iteration, traj.task_id)].append(traj)
        kept = []
        for group in groups.values():
            group.sort(key=lambda t: (_reply_tokens(t), t.episode_id))
            kept += group[: self.shortest_per_task]
            filtered["longer_success"] += max(0, len(group) - self.shortest_per_task)
        return kept

    def draw(self, eligible: list[Sample], iteration: int) -> list[Sample]:
        """`positive_samples_to_train` samples by weighted sampling without replacement."""
        if len(eligible) <= self.positive_samples_to_train:
            return list(eligible)
        rng = self.rng(iteration)
        per_family = Counter(s.family for s in eligible) if self.balance_families else Counter()
        weights = [self.weight(s.iteration, iteration) / per_family.get(s.family, 1) for s in eligible]
        keyed = [(rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)]
        keyed.sort(reverse=True)
        return [eligible[i] for _, i in keyed[: self.positive_samples_to_train]]


@dataclass
class KTOSelector(_Rules):
    """Desirable = steps of successful trajectories, undesirable = steps of failed ones."""

    max_samples: int = 0

    def select(self, trajectories: list[Trajectory], iteration: int, cutoff_len: int) -> Selection:
        filtered: Counter[str] = Counter()
        samples: list[Sample] = []
        for traj in self.usable_trajectories(self.window(trajectories, iteration, filtered), filtered):
            for sample in self.steps(traj, cutoff_len, filtered):
                sample.label = traj.success
                samples.append(sample)
        if 0 < self.max_samples < len(samples):
            samples = self.rng(iteration).sample(samples, self.max_samples)
        return Selection(samples, dict(filtered), len(trajectories))


@dataclass
class DPOSelector(_Rules):
    """Pairs (success, failure) of the same task and iteration, on their first step.

    Samples of one task share the opening prompt (the groups of
    `n_samples_per_task`), so the first steps answer the same messages; a pair
    whose prompts differ is skipped (`prompt_differs`).
    """

    max_pairs_per_task: int = 4
    max_pairs: int = 0

    def select(self, trajectories: list[Trajectory], iteration: int, cutoff_len: int) -> Selection:
        filtered: Counter[str] = Counter()
        groups: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
        for traj in self.usable_trajectories(self.window(trajectories, iteration, filtered), filtered):
            groups[(traj.iteration, traj.task_id)].append(traj)
        pairs: list[Sample] = []
        for group in groups.values():
            wins = [s for t in group if t.success for s in self.steps(_first(t), cutoff_len, filtered)]
            losses = [s for t in group if not t.success for s in self.steps(_first(t), cutoff_len, filtered)]
            if not wins or not losses:
                filtered["no_pair"] += len(group)
                continue
            pairs.extend(self._pair(wins, losses, filtered))
        if 0 < self.max_pairs < len(pairs):
            pairs = self.rng(iteration).sample(pairs, self.max_pairs)
        return Selection(pairs, dict(filtered), len(trajectories))

    def _pair(self, wins: list[Sample], losses: list[Sample], filtered: Counter[str]) -> list[Sample]:
        out = []
        for chosen, rejected in zip(wins, losses, strict=False):
            if len(out) == self.max_pairs_per_task:
                break
            if chosen.messages != rejected.messages:
                filtered["prompt_differs"] += 1
                continue
            chosen.rejected = rejected
            out.append(chosen)
        return out


@dataclass
class GroupSelector(_Rules):
    """Policy gradient: each episode of a group of samples (one task, one iteration) whose rewards differ, every
    step of it with the episode's advantage. Groups whose rewards are all equal teach nothing (every advantage
    is 0): they are dropped and counted (`same_reward_groups`, and their episodes `same_reward_episodes`)."""

    #: divide by the group's standard deviation (GRPO); false: only centre (Dr. GRPO)
    scale_by_std: bool = True

    def select(self, trajectories: list[Trajectory], iteration: int, cutoff_len: int) -> Selection:
        filtered: Counter[str] = Counter()
        groups: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
        for traj in self.usable_trajectories(self.window(trajectories, iteration, filtered), filtered):
            groups[(traj.iteration, traj.task_id)].append(traj)
        samples: list[Sample] = []
        filtered["same_reward_groups"] += 0  # said even when none is dropped: the count a user looks for
        for group in groups.values():
            advantages = group_advantages([episode_return(t) for t in group], self.scale_by_std)
            if advantages is None:
                filtered["same_reward_groups"] += 1
                filtered["same_reward_episodes"] += len(group)
                continue
            for traj, advantage in zip(group, advantages, strict=True):
                for sample in self.steps(traj, cutoff_len, filtered):
                    sample.advantage = advantage
                    samples.append(sample)
        dropped = filtered["same_reward_groups"]
        log.info(
            "grpo: %d groups of samples whose rewards differ give %d rows; %d groups dropped (rewards all equal)",
            len(groups) - dropped,
            len(samples),
            dropped,
        )
        return Selection(samples, dict(filtered), len(trajectories))


def _first(traj: Trajectory) -> Trajectory:
    """The trajectory cut to its first step (the step a DPO pair shares)."""
    return Trajectory(**{**traj.__dict__, "turns": traj.turns[:1]})


def _sample(traj: Trajectory, turn: Turn) -> Sample:
    return Sample(
        episode_id=traj.episode_id,
        task_id=traj.task_id,
        iteration=traj.iteration,
        turn_index=turn.index,
        messages=turn.messages,
        response=turn.response,
        images=list(turn.images),
        prompt_token_ids=turn.prompt_token_ids,
        completion_token_ids=turn.completion_token_ids,
        completion_logprobs=turn.completion_logprobs,
        family=traj.family,
    )


def _length(turn: Turn) -> int:
    """Tokens of prompt plus reply (the ids when stored, else the reported counts)."""
    prompt = len(turn.prompt_token_ids) if turn.prompt_token_ids is not None else turn.prompt_tokens
    reply = len(turn.completion_token_ids) if turn.completion_token_ids is not None else turn.completion_tokens
    return prompt + reply


def _reply_tokens(traj: Trajectory) -> int:
    """Reply tokens of a whole trajectory (the ids when stored, else the reported counts)."""
    return sum(
        len(t.completion_token_ids) if t.completion_token_ids is not None else t.completion_tokens for t in traj.turns
    )


def _has_placeholder(turn: Turn) -> bool:
    texts: list[Any] = [turn.response]
    for message in turn.messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part.get("text", "") for part in content if isinstance(part, dict))
    return any(tag in str(text) for text in texts for tag in MEDIA_PLACEHOLDERS)


def bound_images(selection: Selection, limit: int) -> None:
    """Drop the samples whose prompt holds more than `limit` images (data.max_images_per_sample), counted as
    `too_many_images`: cutting images out of a prompt would train on one the policy never saw (the rollout already
    keeps the newest vllm_config.limit_mm_per_prompt.image; keep the two the same, or this one higher)."""
    kept = [s for s in selection.samples if count_images(s.messages) <= limit]
    dropped = [s for s in selection.samples if count_images(s.messages) > limit]
    if dropped:
        selection.filtered["too_many_images"] = selection.filtered.get("too_many_images", 0) + len(dropped)
        selection.demonstrations -= sum(1 for s in dropped if s.demonstration)
        selection.samples = kept
