"""`--keep-best`: after a held-out evaluation, serve the best policy measured so far again when the one
just evaluated is worse than it by more than a margin (run.sh's master asks; docs/cli.md, "--keep-best").

    decision = decide(load_metrics(log), iteration=5, margin_points=0.0, available=has_weights)
    decision.action   # "revert": promote decision.best's weights (decision.source) as a new version

What counts, all read from `<log>/metrics.jsonl`:
- a measurement is the last `kind: rollout, split: test` record of an iteration up to this one: its
  `policy_version` (None: the base model, version 0) and `success_rate` over `ok_episodes`;
- a revert copy (`kind: revert` records: `policy_version` R holds the weights of `reverted_to` B) is
  the same policy as B: its measurements are B's;
- a policy measured several times is judged by all its measurements pooled (successes / episodes: the
  mean weighted by episodes), which averages the evaluation's noise rather than trusting the latest;
- the served policy is the one this iteration's test rollout measured. It is replaced when its pooled
  held-out success is below the best's by more than `margin_points` (percentage points); a tie keeps
  it; among equally good best policies the newest wins. Only a policy whose weights still exist
  (`available`: a version folder or a revert copy of it; the base model always) can be the best.
- an iteration that reverted already (its `kind: revert` record) is `done`: a resumed run never
  reverts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a success rate difference below this is a tie (floating-point noise, not evaluation noise)
EPS = 1e-9


@dataclass(frozen=True)
class Measurement:
    """One held-out rollout of one policy."""

    iteration: int
    version: int  # as served (a revert copy keeps its own number); 0 = the base model
    success_rate: float
    episodes: int


@dataclass
class Score:
    """A policy's held-out success, pooled over its measurements."""

    policy: int  # the original version (0 = base model)
    successes: float = 0.0
    episodes: int = 0
    measured: list[int] = field(default_factory=list)  # iterations

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


@dataclass
class Decision:
    """What to serve after iteration `iteration`'s held-out evaluation."""

    action: str  # none (no held-out measurement) | keep | revert | done (reverted already)
    iteration: int
    served: int | None = None  # the version the evaluation measured (0 = base)
    best: int | None = None  # the best original version (0 = base)
    served_rate: float | None = None
    best_rate: float | None = None
    margin_points: float = 0.0
    source: int | None = None  # the newest version folder holding the best's weights (0: the base model's)
    reverted_as: int | None = None  # done: the version the earlier revert promoted

    def message(self) -> str:
        """One line for run.sh's log (empty when there is nothing to say)."""
        if self.action == "revert":
            return (
                f"held-out {100 * self.served_rate:.1f} % for {name(self.served)} < "
                f"{100 * self.best_rate:.1f} % for {name(self.best)} (best): serving {name(self.best)} again"
            )
        if self.action == "keep" and self.served_rate is not None and self.best != self.served:
            return (
                f"held-out {100 * self.served_rate:.1f} % for {name(self.served)}, best "
                f"{100 * self.best_rate:.1f} % for {name(self.best)}: within {self.margin_points:g} points, "
                f"keeping {name(self.served)} (--keep-best)"
            )
        return ""


def name(version: int | None) -> str:
    """`v4`, or `the base model` for version 0."""
    return "the base model" if not version else f"v{version}"


def reverts(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Revert copies: version -> the original version whose weights it holds."""
    return {
        int(r["policy_version"]): int(r["reverted_to"])
        for r in rows
        if r.get("kind") == "revert" and r.get("policy_version") is not None
    }


def origin(version: int, copies: dict[int, int]) -> int:
    """The original version of `version` (itself unless it is a revert copy)."""
    seen = set()
    while version in copies and version not in seen:
        seen.add(version)
        version = copies[version]
    return version


def measurements(rows: list[dict[str, Any]], up_to: int) -> list[Measurement]:
    """The last held-out rollout record of each iteration <= `up_to`."""
    last: dict[int, dict[str, Any]] = {}
    for row in rows:
        it = row.get("iteration")
        if row.get("kind") == "rollout" and row.get("split") == "test" and isinstance(it, int) and it <= up_to:
            last[it] = row
    out = []
    for it, row in sorted(last.items()):
        if row.get("success_rate") is None:
            continue
        episodes = int(row.get("ok_episodes") or row.get("episodes") or 0)
        out.append(Measurement(it, int(row.get("policy_version") or 0), float(row["success_rate"]), episodes))
    return out


def scores(found: list[Measurement], copies: dict[int, int]) -> dict[int, Score]:
    """Pooled held-out success per original version."""
    out: dict[int, Score] = {}
    for m in found:
        score = out.setdefault(origin(m.version, copies), Score(origin(m.version, copies)))
        weight = max(m.episodes, 1)  # a record without an episode count weighs as one
        score.successes += m.success_rate * weight
        score.episodes += weight
        score.measured.append(m.iteration)
    return out


def decide(
    rows: list[dict[str, Any]],
    iteration: int,
    margin_points: float,
    available: Callable[[int], bool],
) -> Decision:
    """The decision after `iteration`'s held-out rollout (`available(v)`: version folder v still exists)."""
    done = [r for r in rows if r.get("kind") == "revert" and r.get("iteration") == iteration]
    if done:
        return Decision("done", iteration, reverted_as=done[-1].get("policy_version"), margin_points=margin_points)
    found = measurements(rows, iteration)
    now = [m for m in found if m.iteration == iteration]
    if not now:
        return Decision("none", iteration, margin_points=margin_points)
    copies = reverts(rows)
    table = scores(found, copies)
    served = origin(now[0].version, copies)
    folders = {v: [v, *(c for c, o in copies.items() if o == v)] for v in table}
    candidates = [s for s in table.values() if s.policy in (served, 0) or any(map(available, folders[s.policy]))]
    best = max(candidates, key=lambda s: (round(s.rate, 9), s.policy))
    decision = Decision(
        "keep",
        iteration,
        served=now[0].version,
        best=best.policy,
        served_rate=table[served].rate,
        best_rate=best.rate,
        margin_points=margin_points,
    )
    kept = [v for v in folders[best.policy] if v and available(v)]
    decision.source = max(kept) if kept else 0
    if best.policy != served and table[served].rate < best.rate - margin_points / 100 - EPS:
        decision.action = "revert"
    return decision


@dataclass(frozen=True)
class Found:
    """A decision as the driver acts on it: each value as text ("" when unknown), and the folder to copy."""

    action: str
    served: str
    best: str
    source: str
    served_rate: str
    best_rate: str
    message: str

    def lines(self) -> list[str]:
        return [self.action, self.served, self.best, self.source, self.served_rate, self.best_rate, self.message]


def decide_and_mark(log_path: Path, iteration: int, margin: float, base_model: str) -> Found:
    """Decide for iteration `iteration` from the run's metrics; keep policy/best on the best policy's folder."""
    from rollout_engine.layout import Layout
    from rollout_engine.metrics_log import load_metrics
    from training.promotion import mark_best

    layout = Layout(log_path)
    folder = layout.policy_version
    decision = decide(load_metrics(log_path), iteration, margin, lambda v: folder(v).is_dir())
    source = ""
    if decision.action == "revert":
        source = base_model if decision.source == 0 else str(folder(decision.source))
    if decision.action in ("keep", "revert"):
        mark_best(layout.policy, decision.source or None)

    def text(value: object) -> str:
        return "" if value is None else str(value)

    return Found(
        decision.action,
        text(decision.served),
        text(decision.best),
        source,
        text(decision.served_rate),
        text(decision.best_rate),
        decision.message(),
    )
