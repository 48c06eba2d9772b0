"""One `"kind": "iteration"` record per RL iteration in `<log>/metrics.jsonl`.

    record = summarize(log_path, iteration=3, served_version=2)   # appended, and returned

It gathers what the phases already wrote for that iteration (the train and
test rollouts' `kind: rollout` lines, the update's `kind: training` and
`kind: promotion` lines), the update's outcome and the seconds of each phase
(both from `<log>/run/state/iter_<NNNN>/`). Readers take the last record of
an iteration (a restarted iteration appends a new one).

The reply statistics (`REPLY_KEYS`: completion tokens per turn and the share
of invalid actions, per split) are the rollout lines' own, which the engine
computes from the journals; `iteration_records` fills them in from those lines
for records written before the record carried them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coordinator.runstate import load_markers, phase_times
from rollout_engine.files import append_shared_jsonl
from rollout_engine.layout import Layout
from rollout_engine.metrics_log import load_metrics

log = logging.getLogger(__name__)


@dataclass
class IterationRecord:
    """The summary line of one iteration."""

    iteration: int
    kind: str = "iteration"
    served_version: int | None = None
    train_success_rate: float | None = None
    train_episodes: int | None = None
    eval_success_rate: float | None = None
    eval_episodes: int | None = None
    #: completion tokens per turn of the train / held-out rollout (RFT's length drift shows here)
    train_mean_response_tokens: float | None = None
    eval_mean_response_tokens: float | None = None
    #: invalid turns / turns (reasoning-gym: replies with no answer, i.e. no number or answer tag)
    train_invalid_action_rate: float | None = None
    eval_invalid_action_rate: float | None = None
    train_loss: float | None = None
    training_steps: int | None = None
    update: str | None = None
    promoted_version: int | None = None
    #: --keep-best: the version a revert promoted before this iteration's update, and whose weights it holds (0: base)
    reverted_version: int | None = None
    reverted_to: int | None = None
    #: the policy server's dtype this iteration (run/rank_0/serving.json, the master's; None with an external server)
    serving_dtype: str | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    time: float = 0.0


def _last(rows: list[dict], **match: Any) -> dict | None:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[-1] if found else None


#: record key -> (rollout split, rollout key)
REPLY_KEYS: dict[str, tuple[str, str]] = {
    "train_mean_response_tokens": ("train", "mean_response_tokens"),
    "eval_mean_response_tokens": ("test", "mean_response_tokens"),
    "train_invalid_action_rate": ("train", "invalid_action_rate"),
    "eval_invalid_action_rate": ("test", "invalid_action_rate"),
}


def reply_stats(rows: list[dict], iteration: int) -> dict[str, float | None]:
    """The iteration's reply statistics (REPLY_KEYS) from its last train and test rollout lines."""
    rollouts = {split: _last(rows, kind="rollout", split=split, iteration=iteration) for split in ("train", "test")}
    return {key: (rollouts[split] or {}).get(rollout_key) for key, (split, rollout_key) in REPLY_KEYS.items()}


def build_record(log_path: Path, iteration: int, served_version: int | None) -> IterationRecord:
    """The iteration's summary from metrics.jsonl and the run state."""
    rows = load_metrics(log_path)
    record = IterationRecord(iteration=iteration, served_version=served_version, time=time.time())
    train = _last(rows, kind="rollout", split="train", iteration=iteration)
    test = _last(rows, kind="rollout", split="test", iteration=iteration)
    training = _last(rows, kind="training", iteration=iteration)
    promotion = _last(rows, kind="promotion", iteration=iteration)
    if train:
        record.train_success_rate, record.train_episodes = train.get("success_rate"), train.get("ok_episodes")
    if test:
        record.eval_success_rate, record.eval_episodes = test.get("success_rate"), test.get("ok_episodes")
    if training:
        record.train_loss, record.training_steps = training.get("train_loss"), training.get("steps")
    if promotion:
        record.promoted_version = promotion.get("policy_version")
    for key, value in reply_stats(rows, iteration).items():
        setattr(record, key, value)
    if revert := _last(rows, kind="revert", iteration=iteration):
        record.reverted_version, record.reverted_to = revert.get("policy_version"), revert.get("reverted_to")
    serving = Layout(log_path).serving(0)  # the master's server
    if serving.exists():
        with contextlib.suppress(ValueError):
            record.serving_dtype = json.loads(serving.read_text()).get("dtype")
    record.update = load_markers(log_path, iteration).get("update") or None
    record.phase_s = phase_times(log_path, iteration)
    return record


def summarize(log_path: Path, iteration: int, served_version: int | None) -> dict[str, Any]:
    """Append the iteration's record to metrics.jsonl and return it; once only: a run that recorded it and
    died before the iteration's end marker (a full disk, a SIGKILL) gets the record it wrote back on --resume."""
    recorded = _last(load_metrics(log_path), kind="iteration", iteration=iteration)
    if recorded is not None:
        return recorded
    record = asdict(build_record(log_path, iteration, served_version))
    append_shared_jsonl(Layout(log_path).metrics, record)
    return record


def _percent(rate: float | None, episodes: int | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f} % ({episodes or 0})"


def _replies(record: dict[str, Any]) -> str:
    """Reply tokens per turn and the share of invalid replies, train and held-out."""

    def tokens(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def invalid(rate: float | None) -> str:
        return "" if rate is None else f" ({100 * rate:.1f} % invalid)"

    return (
        f"reply tokens train {tokens(record.get('train_mean_response_tokens'))}"
        f"{invalid(record.get('train_invalid_action_rate'))}, "
        f"held-out {tokens(record.get('eval_mean_response_tokens'))}{invalid(record.get('eval_invalid_action_rate'))}"
    )


def summary_line(record: dict[str, Any]) -> str:
    """The iteration in one line: success train / held-out, reply tokens and invalid shares, loss, the update's
    outcome, seconds per phase."""
    loss = record.get("train_loss")
    phases = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in record.get("phase_s", {}).items())
    served = record.get("served_version")
    timed = phases or "no phase timed"
    if (reverted := record.get("reverted_version")) is not None:
        was = record.get("reverted_to")
        timed = f"reverted to {'v' + str(was) if was else 'base'} as v{reverted} (--keep-best); {timed}"
    return (
        f"iteration {record['iteration']} (served {'v' + str(served) if served is not None else 'base'}): "
        f"success train {_percent(record.get('train_success_rate'), record.get('train_episodes'))}, "
        f"held-out {_percent(record.get('eval_success_rate'), record.get('eval_episodes'))}; "
        f"{_replies(record)}; "
        f"loss {'-' if loss is None else f'{loss:.4f}'}; update: {record.get('update') or '-'}; "
        f"{timed}"
    )


def iteration_records(log_path: Path) -> list[dict[str, Any]]:
    """The last record of each iteration, in iteration order; a record written before the reply statistics
    were recorded gets them from its rollout lines."""
    rows = load_metrics(log_path)
    by_iteration = {r["iteration"]: r for r in rows if r.get("kind") == "iteration"}
    records = [by_iteration[k] for k in sorted(by_iteration)]
    for record in records:
        if not REPLY_KEYS.keys() <= record.keys():
            record.update({**reply_stats(rows, record["iteration"]), **record})
    return records
