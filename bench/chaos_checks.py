"""The invariants the fault-injection harness checks on a log path after a run (docs/reliability.md).

    from bench.chaos_checks import check_log
    report = check_log(Path("/logs/exp1"), needles=["--port 18431"])
    print(report.problems())   # [] when every invariant holds

- exactly once: every planned episode of every sealed rollout journal
  (`trajectories/<split>/iter_<NNNN>/rank_<r>.jsonl`) is on exactly one line, its
  manifest says `complete`, and the journal is the one it sealed (sha256);
- exactly once across ranks (an iteration of several ranks: `manifest.json` or more than one
  journal): the episodes planned for every rank, as any rank plans them from the iteration's
  saved config, are each on exactly one line of the iteration's data (the ranks' journals, a dead
  rank's only up to its cut, and the takeover journals `rank_<s>.takeover_<d>.jsonl`), every such
  journal is the one sealed (a cut: its prefix's sha256), and the master's merge says `complete`;
- the policy chain: the versions under `policy/` are consecutive, each one's
  `parent` is the version before it, no iteration promoted twice, `policy/current`
  is the newest, and each iteration's `update.done` names the version it promoted
  (a `--keep-best` revert is a version of its own: it names `reverted_to`, and is
  neither the iteration's promotion nor counted as one);
- one `"kind": "iteration"` record per iteration in `metrics.jsonl`;
- a worker restarted late (`--on-rank-failure continue`) rejoined: `check_rejoined`, its own sealed
  journal in an iteration after the one it died in (it was a member of a later step), and every
  iteration of the run done (`check_iterations_done`);
- deadlines: no phase in `run/state/iter_<NNNN>/times` took longer than its deadline;
- nothing left: no recorded process group alive (`run/rank_<r>/groups.json`,
  `training/iter_<NNNN>/train[.rank_<r>].log.pgid`), no process whose command line names the
  log path (or one of `needles`, e.g. the run's vLLM port).

Reads only; used by `bench/chaos.py`, `bench/chaos_nodes.py` and `tests/e2e/test_chaos.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from coordinator import groupfile
from coordinator.runstate import load_times, state_iterations
from rollout_engine.layout import GROUPS_NAME, MERGED_MANIFEST, Layout, manifest_name, parse_iteration, version_name
from training.groups import start_ticks


@dataclass
class RolloutCheck:
    """One rank's journal of one rollout."""

    journal: str
    planned: int | None  # None: no manifest (never sealed)
    lines: int
    unique: int
    complete: bool
    verified: bool  # the journal's sha256 is the one its manifest sealed
    asides: int  # earlier journals moved aside by a rerun without --resume

    @property
    def duplicated(self) -> int:
        return self.lines - self.unique

    @property
    def lost(self) -> int | None:
        return None if self.planned is None else max(self.planned - self.unique, 0)

    def problems(self) -> list[str]:
        out = []
        if self.planned is None:
            out.append(f"{self.journal}: not sealed (no manifest)")
        elif self.lost:
            out.append(f"{self.journal}: {self.lost} of {self.planned} planned episodes lost")
        if self.duplicated:
            out.append(f"{self.journal}: {self.duplicated} episodes duplicated")
        if self.planned is not None and not self.complete:
            out.append(f"{self.journal}: manifest not complete")
        if self.planned is not None and not self.verified:
            out.append(f"{self.journal}: changed after it was sealed (sha256 differs from its manifest)")
        return out


def read_lines(path: Path) -> list[dict]:
    """The trajectory lines of a journal that parse (a torn last line is no episode)."""
    return read_text_lines(path.read_text())


def read_text_lines(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def check_rollout(journal: Path) -> RolloutCheck:
    """Exactly once for one journal, against its manifest (`rank_<r>.manifest.json`)."""
    ids = [row.get("episode_id") for row in read_lines(journal)] if journal.exists() else []
    manifest_path = journal.with_name(manifest_name(journal.name))
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    data = journal.read_bytes() if journal.exists() else b""
    return RolloutCheck(
        journal=str(journal),
        planned=None if manifest is None else int(manifest["planned"]),
        lines=len(ids),
        unique=len(set(ids)),
        complete=bool(manifest and manifest.get("complete")),
        verified=bool(manifest and manifest.get("sha256") == hashlib.sha256(data).hexdigest()),
        asides=len(list(journal.parent.glob(journal.name + ".aside-*"))),
    )


OWN_JOURNAL = re.compile(r"rank_(\d+)\.jsonl")
TAKEOVER_JOURNAL = re.compile(r"rank_(\d+)\.takeover_(\d+)\.jsonl")


def several_ranks(directory: Path) -> bool:
    """An iteration of a multi-node run: the master's merge (manifest.json) or more than one rank's journal."""
    own = [p for p in directory.glob("rank_*.jsonl") if OWN_JOURNAL.fullmatch(p.name)]
    return (directory / MERGED_MANIFEST).exists() or len(own) > 1


def selected(directory: Path, iterations: list[int] | None) -> bool:
    return iterations is None or parse_iteration(directory.name) in iterations


def check_rollouts(log: Path, iterations: list[int] | None = None) -> list[RolloutCheck]:
    """Every own rank journal of the given single-node iterations (default: all) of both splits
    (an iteration of several ranks is check_iterations')."""
    out = []
    for journal in sorted(log.glob("trajectories/*/iter_*/rank_*.jsonl")):
        if not OWN_JOURNAL.fullmatch(journal.name) or several_ranks(journal.parent):
            continue
        if selected(journal.parent, iterations):
            out.append(check_rollout(journal))
    return out


@dataclass
class IterationCheck:
    """One iteration of several ranks: every rank's planned episodes against the iteration's data."""

    directory: str
    planned: int  # the episodes planned for every rank (from the saved config); -1 when it could not be read
    lines: int  # the lines of the iteration's data (a dead rank's journal up to its cut)
    unique: int
    lost: int  # planned episodes on no line
    unexpected: int  # episodes on a line that no rank planned
    merged: bool  # the master wrote manifest.json
    complete: bool  # ... and says complete
    unsealed: list[str] = field(default_factory=list)  # journals of the data not sealed, or changed since

    @property
    def duplicated(self) -> int:
        return self.lines - self.unique

    def problems(self) -> list[str]:
        where = self.directory
        out = [f"{where}: the planned episodes could not be read (no rank_<r>.config.yaml)"] if self.planned < 0 else []
        if self.lost:
            out.append(f"{where}: {self.lost} of {self.planned} planned episodes lost (on no rank's line)")
        if self.duplicated:
            out.append(f"{where}: {self.duplicated} episodes duplicated across the ranks' journals")
        if self.unexpected:
            out.append(f"{where}: {self.unexpected} episodes that no rank planned")
        out += [f"{where}/{name}: not sealed, or changed since it was sealed" for name in self.unsealed]
        if not self.merged:
            out.append(f"{where}: not merged by the master (no manifest.json)")
        elif not self.complete:
            out.append(f"{where}: the master's manifest.json is not complete")
        return out


def planned_episodes(directory: Path) -> list[str] | None:
    """Every rank's planned episode ids of one iteration, as any rank plans them from its saved config
    (`rank_<r>.config.yaml`: the same seed, sampling and rank weights on every rank); None without one."""
    from omegaconf import OmegaConf

    from rollout_engine.config import validate
    from rollout_engine.tasks import load_tasks, plan_rank, tasks_path

    configs = sorted(p for p in directory.glob("rank_*.config.yaml") if re.fullmatch(r"rank_\d+\.config\.yaml", p.name))
    if not configs:
        return None
    cfg = validate(OmegaConf.load(configs[0]))
    tasks = load_tasks(tasks_path(cfg), f"env_config.{cfg.split}_tasks")
    return [spec.episode_id for rank in range(len(cfg.rank_weights)) for spec in plan_rank(tasks, cfg, rank)]


def sealed(directory: Path, name: str) -> bool:
    """The journal has a manifest that says complete, and is byte for byte what that manifest sealed."""
    manifest_path = directory / manifest_name(name)
    if not manifest_path.exists():
        return False
    manifest = json.loads(manifest_path.read_text())
    data = (directory / name).read_bytes() if (directory / name).exists() else b""
    return bool(manifest.get("complete")) and manifest.get("sha256") == hashlib.sha256(data).hexdigest()


def cut_ids(journal: Path, lines: int, sha256: str) -> list[str] | None:
    """The episode ids of a dead rank's journal up to its cut (its first `lines` lines); None when that
    prefix is not the one cut (sha256)."""
    data = journal.read_bytes() if journal.exists() else b""
    parts = data.split(b"\n")
    if len(parts) <= lines:
        return None
    prefix = b"".join(part + b"\n" for part in parts[:lines])
    if hashlib.sha256(prefix).hexdigest() != sha256:
        return None
    return [row.get("episode_id") for row in read_text_lines(prefix.decode())]


def check_iteration(directory: Path) -> IterationCheck:
    """Exactly once across the ranks of one iteration: what the data is (the ranks' journals; with a
    takeover, each dead rank's up to its cut and the takeover journals) against what every rank planned."""
    manifest_path = directory / MERGED_MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    dead = {int(r) for r in manifest.get("missing_ranks", [])}
    ids: list[str] = []
    unsealed: list[str] = []
    for path in sorted(directory.glob("rank_*.jsonl")):
        own, takeover = OWN_JOURNAL.fullmatch(path.name), TAKEOVER_JOURNAL.fullmatch(path.name)
        if own and int(own.group(1)) in dead:
            cut = manifest.get("cut", {}).get(own.group(1), {})
            rows = cut_ids(path, int(cut.get("lines", 0)), str(cut.get("sha256", "")))
            if rows is None:
                unsealed.append(f"{path.name} (up to its cut)")
            ids += rows or []
        elif takeover and path.name in manifest.get("superseded", {}):
            continue  # an interrupted takeover's journal, never read: its dead rank's own journal is the data
        elif own or takeover:
            ids += [row.get("episode_id") for row in read_lines(path)]
            if not sealed(directory, path.name):
                unsealed.append(path.name)
    planned = planned_episodes(directory)
    wanted, present = set(planned or []), set(ids)
    return IterationCheck(
        directory=str(directory),
        planned=-1 if planned is None else len(planned),
        lines=len(ids),
        unique=len(present),
        lost=len(wanted - present),
        unexpected=len(present - wanted) if planned is not None else 0,
        merged=bool(manifest),
        complete=bool(manifest.get("complete")),
        unsealed=unsealed,
    )


def check_iterations(log: Path, iterations: list[int] | None = None) -> list[IterationCheck]:
    """Every iteration of several ranks (default: all) of both splits."""
    return [
        check_iteration(directory)
        for directory in sorted(log.glob("trajectories/*/iter_*"))
        if directory.is_dir() and several_ranks(directory) and selected(directory, iterations)
    ]


def check_policy_chain(log: Path) -> list[str]:
    """Problems of the promoted versions: gaps, a parent that is not the previous version, an iteration
    promoted twice, `current` not the newest, an `update.done` that disagrees with the records. A revert
    (`reverted_to` set, --keep-best) is in the chain but is not its iteration's promotion."""
    root = Layout(log).policy
    records = {}
    for path in sorted(root.glob("v[0-9]*/baton_policy.json")):
        record = json.loads(path.read_text())
        records[int(record["version"])] = record
    problems = []
    versions = sorted(records)
    for version in versions:
        parent = records[version].get("parent")
        expected = None if version == 1 else version - 1
        if parent != expected:
            problems.append(f"{version_name(version)}: parent {parent}, expected {expected}")
    if versions and versions != list(range(versions[0], versions[-1] + 1)):
        problems.append(f"versions not consecutive: {versions}")
    promotions = {v: r for v, r in records.items() if r.get("reverted_to") is None}
    reverts = {v: r for v, r in records.items() if v not in promotions}
    for version, record in reverts.items():
        to = record["reverted_to"]
        if not isinstance(to, int) or not 0 <= to < version:
            problems.append(
                f"{version_name(version)}: reverted_to {to!r}, expected an earlier version (0: the base model)"
            )
    for what, chain in (("promoted", promotions), ("reverted", reverts)):
        twice = [it for it, n in Counter(r["iteration"] for r in chain.values()).items() if n > 1]
        if twice:
            problems.append(f"iterations {what} twice: {sorted(twice)}")
    current = Layout(log).policy_current
    if versions and (not current.is_symlink() or Path(current.readlink()).name != version_name(versions[-1])):
        target = current.readlink() if current.is_symlink() else None
        problems.append(f"policy/current is {target}, expected {version_name(versions[-1])}")
    for version, record in promotions.items():
        done = Layout(log).marker(record["iteration"], "update")
        if done.exists() and done.read_text().strip() != f"promoted v{version}":
            problems.append(
                f"{version_name(version)} (iteration {record['iteration']}): update.done says {done.read_text()!r}"
            )
    return problems


def check_iteration_records(log: Path) -> list[str]:
    """More than one `"kind": "iteration"` record of an iteration in metrics.jsonl, or an update record merged
    into it more than once (its `update_seq` twice)."""
    path = Layout(log).metrics
    rows = read_lines(path) if path.exists() else []
    counts = Counter(row["iteration"] for row in rows if row.get("kind") == "iteration")
    merged = Counter(row["update_seq"] for row in rows if "update_seq" in row)
    return [f"metrics.jsonl: iteration {it} recorded {n} times" for it, n in sorted(counts.items()) if n > 1] + [
        f"metrics.jsonl: the update's record {seq} merged {n} times" for seq, n in sorted(merged.items()) if n > 1
    ]


def member_iterations(log: Path, rank: int, split: str = "train") -> list[int]:
    """The iterations of `split` in which `rank` rolled out as a member of the step: its own journal
    (`rank_<r>.jsonl`, never a takeover's) sealed complete with at least one episode."""
    found = []
    for directory in sorted(log.glob(f"trajectories/{split}/iter_*")):
        journal = directory / f"rank_{rank}.jsonl"
        if journal.exists() and sealed(directory, journal.name) and read_lines(journal):
            found.append(parse_iteration(directory.name))
    return found


def check_rejoined(log: Path, rank: int, died_in: int, last: int) -> list[str]:
    """A worker that died in iteration `died_in` and was started again is a member of a later step of the
    run (up to iteration `last`): its sealed train journal in one of the iterations died_in+1 .. last."""
    later = [n for n in member_iterations(log, rank) if died_in < n <= last]
    if later:
        return []
    return [
        f"rank {rank} did not rejoin: no sealed train journal of it in iterations {died_in + 1}..{last} "
        f"(it died in iteration {died_in}); member of {member_iterations(log, rank) or 'none'}"
    ]


def check_iterations_done(log: Path, first: int, last: int) -> list[str]:
    """Every iteration first .. last has its end marker (`run/state/iter_<NNNN>/iteration.done`)."""
    return [
        f"iteration {n} not done (no {Layout(log).marker(n, 'iteration').relative_to(log)})"
        for n in range(first, last + 1)
        if not Layout(log).marker(n, "iteration").exists()
    ]


def load_phase_times(log: Path) -> list[tuple[int, str, float]]:
    """(iteration, phase, seconds) for every line of every `run/state/iter_<NNNN>/times`."""
    return [(n, phase, seconds) for n in state_iterations(log) for phase, seconds in load_times(log, n)]


def check_deadlines(log: Path, deadlines: dict[str, float]) -> list[str]:
    """Phases that took longer than their deadline (`deadlines`: phase -> seconds; others unchecked)."""
    return [
        f"iteration {it}: {phase} took {seconds:g} s, past its deadline of {deadlines[phase]:g} s"
        for it, phase, seconds in load_phase_times(log)
        if phase in deadlines and seconds > deadlines[phase]
    ]


def start_time(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot, as coordinator/driver/procs.py reads it; None when gone."""
    try:
        return str(start_ticks(psutil.Process(pid)))
    except psutil.NoSuchProcess:
        return None


def group_alive(pgid: int) -> bool:
    """A non-zombie process of group `pgid` runs."""
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
    return False


def recorded_groups(log: Path) -> list[tuple[str, int, str]]:
    """(record, pgid, leader start time) of every group the run recorded and did not forget."""
    # every rank's groups, LLaMA-Factory's of every node (train.log.pgid, train.rank_<r>.log.pgid), the warm trainer's
    out = [
        (f"{path}:{name}", r.pgid, r.start or "-")
        for path in sorted(log.glob(f"run/rank_*/{GROUPS_NAME}"))
        for name, r in sorted(groupfile.read(path).items())
    ]
    files = sorted(log.glob("training/iter_*/*.log.pgid"))
    files += sorted(log.glob("run/rank_*/logs/trainer.log.pgid"))
    for path in files:
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0].isdigit():
                out.append((str(path), int(parts[0]), parts[1] if len(parts) > 1 else "-"))
    return out


def ancestors() -> set[int]:
    """This process and its ancestors (the harness, the shell that started it: never the run's)."""
    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


def leftover_processes(log: Path, needles: list[str] = (), recorded: bool = True) -> list[str]:
    """Live processes of the run: recorded groups still running (leader's start time checked, as the
    driver's procs.py does), and processes whose command line names the log path or a needle.
    `recorded` False: the run recorded its groups inside PID namespaces of its own (bench/nodes.py), whose
    ids mean nothing here; only the command lines are looked at."""
    left = []
    for path, pgid, start in recorded_groups(log) if recorded else []:
        now = start_time(pgid)
        if (now is None or start in ("-", now)) and group_alive(pgid):
            left.append(f"group {pgid} recorded in {path}")
    mine = ancestors()
    for proc in psutil.process_iter(["status", "cmdline"]):
        args = " ".join(proc.info["cmdline"] or [])
        if proc.pid in mine or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(n in args for n in [str(log), *needles]):
            left.append(f"pid {proc.pid}: {args[:200]}")
    return left


@dataclass
class LogReport:
    """Everything check_log found on one log path."""

    rollouts: list[RolloutCheck]
    chain: list[str]
    records: list[str]
    late: list[str]
    leftovers: list[str] = field(default_factory=list)
    iterations: list[IterationCheck] = field(default_factory=list)  # those of several ranks

    @property
    def lost(self) -> int:
        return sum(r.lost or 0 for r in self.rollouts) + sum(i.lost for i in self.iterations)

    @property
    def duplicated(self) -> int:
        return sum(r.duplicated for r in self.rollouts) + sum(i.duplicated for i in self.iterations)

    def problems(self) -> list[str]:
        out = [p for r in self.rollouts for p in r.problems()] + [p for i in self.iterations for p in i.problems()]
        return out + self.chain + self.records + self.late + [f"left running: {p}" for p in self.leftovers]


def check_log(
    log: Path,
    *,
    iterations: list[int] | None = None,
    deadlines: dict[str, float] | None = None,
    needles: list[str] = (),
    processes: bool = True,
    recorded: bool = True,
) -> LogReport:
    """Every invariant on `log` (`processes`: also look for what the run left running; `recorded` False: not
    by its recorded groups, whose ids are those of the nodes' own PID namespaces)."""
    return LogReport(
        rollouts=check_rollouts(log, iterations),
        iterations=check_iterations(log, iterations),
        chain=check_policy_chain(log),
        records=check_iteration_records(log),
        late=check_deadlines(log, deadlines or {}),
        leftovers=leftover_processes(log, list(needles), recorded) if processes else [],
    )
