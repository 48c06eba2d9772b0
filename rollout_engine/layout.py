"""Where everything lives under a log path: the one owner of its layout (docs/formats.md).

    layout = Layout(log_path)
    layout.journal("train", 3, rank=1)      # <log>/trajectories/train/iter_0003/rank_1.jsonl
    layout.state_dir(3)                     # <log>/run/state/iter_0003 (phase markers)
    layout.training_dir(3)                  # <log>/training/iter_0003 (files: training.update.RunPaths)
    layout.policy_version(2)                # <log>/policy/v0002
    layout.cluster_run(run_id).barrier_dir(3, "train_rollout")

Names inside a folder someone already holds (`iteration_name`, `journal_name`,
`manifest_name`, `version_name`, ...) are plain functions; `iterations(folder)`
lists a folder's `iter_<NNNN>` entries and `Layout.owners()` every rank's owner
records (the two listings here; the rest is path arithmetic, and nothing reads or
writes a file). It sits at the bottom of the import graph so that
rollout_engine, training and coordinator (and bench) all spell a path one way;
tests/unit/test_layout.py checks that no other module formats `iter_%04d` or
`v%04d` (the driver, coordinator/driver/, included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ITERATION = re.compile(r"iter_(\d+)")
VERSION = re.compile(r"^v(\d{4,})$")
#: the iteration's merge of every rank's manifest (several nodes), beside the journals
MERGED_MANIFEST = "manifest.json"
#: the master's takeover plan (--on-rank-failure continue), beside the journals
TAKEOVER_PLAN = "takeover.json"
#: a rank's own journal (`rank_<r>.jsonl`) or a takeover journal (`rank_<s>.takeover_<d>.jsonl`)
JOURNAL = re.compile(r"rank_(\d+)(?:\.takeover_(\d+))?\.jsonl")
#: `rank_<s>.takeover_<d>.jsonl`: survivor s's journal of dead rank d's episodes (takeover_journal_name)
TAKEOVER_JOURNAL = re.compile(r"rank_(\d+)\.takeover_(\d+)\.jsonl")
#: phases of an iteration that leave a marker `<phase>.done` in its state folder
MARKER_SUFFIX = ".done"
#: a rank's owner record of one role, `owner.<role>` in its run folder (locked to claim the role; an older run's
#: `owner.lock` may be there too)
OWNER_PREFIX = "owner."
#: `run/rank_<r>/groups.json`: the process groups a rank runs now (format: coordinator/groupfile.py)
GROUPS_NAME = "groups.json"


def iteration_name(iteration: int) -> str:
    """`iter_<NNNN>`: the folder (or file stem) of one iteration."""
    return f"iter_{iteration:04d}"


def parse_iteration(name: str) -> int | None:
    """The number of an `iter_<NNNN>` name, None for any other name."""
    match = ITERATION.fullmatch(name)
    return int(match.group(1)) if match else None


def iterations(folder: Path) -> list[tuple[int, Path]]:
    """(number, path) of every `iter_<NNNN>` entry of `folder`, ascending; none when it does not exist."""
    if not folder.is_dir():
        return []
    found = [(n, p) for p in folder.iterdir() if (n := parse_iteration(p.name)) is not None]
    return sorted(found)


def version_name(version: int) -> str:
    """`v<NNNN>`: a promoted policy's folder under policy/."""
    return f"v{version:04d}"


def parse_version(name: str) -> int | None:
    """The number of a `v<NNNN>` name, None for any other name."""
    match = VERSION.fullmatch(name)
    return int(match.group(1)) if match else None


def staging_name(version: int, pid: int) -> str:
    """A promotion in progress: `.staging-v<NNNN>-<pid>` under policy/."""
    return f".staging-{version_name(version)}-{pid}"


def journal_name(rank: int) -> str:
    """A rank's own journal of one rollout."""
    return f"rank_{rank}.jsonl"


def parse_journal_name(name: str) -> tuple[int, int | None] | None:
    """(rank, dead rank or None) of a journal's name; None for a name that is not a journal."""
    match = JOURNAL.fullmatch(name)
    if not match:
        return None
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


def takeover_journal_name(rank: int, dead: int) -> str:
    """The journal of the episodes of dead rank `dead` that rank `rank` rolled out."""
    return f"rank_{rank}.takeover_{dead}.jsonl"


def manifest_name(journal: str) -> str:
    """The sealed manifest beside a journal: `rank_1.jsonl` -> `rank_1.manifest.json`."""
    return journal.removesuffix(".jsonl") + ".manifest.json"


def rollout_config_name(rank: int, takeover: bool = False) -> str:
    """The resolved config a rollout saves beside its journal (a takeover's apart from the rank's own)."""
    return f"rank_{rank}.takeover.config.yaml" if takeover else f"rank_{rank}.config.yaml"


def owner_role(name: str) -> str | None:
    """The role of an owner record's name (`owner.rollout` -> rollout), None for any other name."""
    return name.removeprefix(OWNER_PREFIX) if name.startswith(OWNER_PREFIX) else None


def rank_file_name(rank: int, suffix: str = "") -> str:
    """`rank_<r>` plus `suffix` (".json", ".jsonl", ...): one rank's file in a folder of all ranks' files."""
    return f"rank_{rank}{suffix}"


@dataclass(frozen=True)
class ClusterRun:
    """One multi-node run's protocol folder, `cluster/runs/<run_id>/` (coordinator.cluster, docs/multinode.md)."""

    dir: Path

    record = property(lambda self: self.dir / "run.json")
    heartbeat_dir = property(lambda self: self.dir / "heartbeat")
    nodes_dir = property(lambda self: self.dir / "nodes")
    failed_dir = property(lambda self: self.dir / "failed")
    evicted_dir = property(lambda self: self.dir / "evicted")
    barriers = property(lambda self: self.dir / "barriers")
    stop = property(lambda self: self.dir / "stop.json")
    #: the shared-filesystem check at the run's start (coordinator.fscheck): its files, and findings.json
    fscheck = property(lambda self: self.dir / "fscheck")
    finished = property(lambda self: self.dir / "finished.json")

    def barrier_dir(self, iteration: int, phase: str) -> Path:
        return self.barriers / iteration_name(iteration) / phase

    def barrier_open(self, iteration: int, phase: str) -> Path:
        """The master's word that every rank it waited for arrived (coordinator.barrier.open_barrier)."""
        return self.barrier_dir(iteration, phase) / "open.json"


@dataclass(frozen=True)
class Layout:
    """The paths of one log path (`root`). Frozen and cheap: build one wherever a log path is at hand."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # rollouts
    def trajectories(self, split: str) -> Path:
        return self.root / "trajectories" / split

    def iteration_dir(self, split: str, iteration: int) -> Path:
        """The journals of one rollout: `trajectories/<split>/iter_<NNNN>/`."""
        return self.trajectories(split) / iteration_name(iteration)

    def journal(self, split: str, iteration: int, rank: int) -> Path:
        return self.iteration_dir(split, iteration) / journal_name(rank)

    def merged_manifest(self, split: str, iteration: int) -> Path:
        return self.iteration_dir(split, iteration) / MERGED_MANIFEST

    def takeover_plan(self, split: str, iteration: int) -> Path:
        return self.iteration_dir(split, iteration) / TAKEOVER_PLAN

    def status(self, rank: int | None = None) -> Path:
        """The live rollout snapshot: `status.json` on one node (rank None), `status.rank_<r>.json` on several."""
        return self.root / ("status.json" if rank is None else f"status.rank_{rank}.json")

    #: several nodes: the master's view of every rank in totals, for the other nodes' (coordinator/clusterview.py)
    status_totals = property(lambda self: self.root / "status.totals.json")

    # metrics
    metrics = property(lambda self: self.root / "metrics.jsonl")
    metrics_dir = property(lambda self: self.root / "metrics")

    def rank_metrics(self, rank: int) -> Path:
        """Several nodes: rank r's own rollout records (the master merges them into metrics.jsonl)."""
        return self.metrics_dir / rank_file_name(rank, ".jsonl")

    #: the update's records (training, promotion, revert): its own file, merged into metrics.jsonl by the
    #: master that rolls out (rollout_engine.metrics_log)
    update_metrics = property(lambda self: self.metrics_dir / "update.jsonl")

    plot = property(lambda self: self.root / "plots" / "success.png")
    trackers = property(lambda self: self.root / "trackers")

    # the run's own state (run.sh today, the driver tomorrow)
    state_root = property(lambda self: self.root / "run" / "state")

    def state_dir(self, iteration: int) -> Path:
        """Iteration numbering and phase markers: `run/state/iter_<NNNN>/`."""
        return self.state_root / iteration_name(iteration)

    def marker(self, iteration: int, phase: str) -> Path:
        """`run/state/iter_<NNNN>/<phase>.done`: the phase finished (its content: what it did)."""
        return self.state_dir(iteration) / f"{phase}{MARKER_SUFFIX}"

    def times(self, iteration: int) -> Path:
        return self.state_dir(iteration) / "times"

    def rank_dir(self, rank: int) -> Path:
        """`run/rank_<r>/`: one node's run state (logs/, groups.json, owner records, resolved.yaml, serving.json)."""
        return self.root / "run" / rank_file_name(rank)

    def logs_dir(self, rank: int) -> Path:
        return self.rank_dir(rank) / "logs"

    def phase_log(self, rank: int, iteration: int, what: str) -> Path:
        """`run/rank_<r>/logs/iter_<NNNN>.<what>.log` (what: update, train, test, revert, ...)."""
        return self.logs_dir(rank) / f"{iteration_name(iteration)}.{what}.log"

    def owner(self, rank: int, role: str) -> Path:
        """`run/rank_<r>/owner.<role>`: `host pid start_time` of the run.sh that runs `role` on rank r."""
        return self.rank_dir(rank) / f"{OWNER_PREFIX}{role}"

    def owners(self) -> list[Path]:
        """Every rank's `run/rank_*/owner.*` (an older run's owner.lock among them), sorted."""
        return sorted(self.root.glob(f"run/rank_*/{OWNER_PREFIX}*"))

    def groups(self, rank: int) -> Path:
        """`run/rank_<r>/groups.json`: the process groups rank r's run.sh runs now (coordinator/groupfile.py)."""
        return self.rank_dir(rank) / GROUPS_NAME

    def trainer_dir(self, rank: int) -> Path:
        """`run/rank_<r>/trainer/`: the warm trainer's jobs and answers (training/warm.py describes the files)."""
        return self.rank_dir(rank) / "trainer"

    def trainer_log(self, rank: int) -> Path:
        """`run/rank_<r>/logs/trainer.log`: the warm trainer's output; `trainer.log.pgid` lists its torchrun groups."""
        return self.logs_dir(rank) / "trainer.log"

    def resolved(self, rank: int) -> Path:
        return self.rank_dir(rank) / "resolved.yaml"

    def serving(self, rank: int) -> Path:
        return self.rank_dir(rank) / "serving.json"

    # updates and policies
    def training_dir(self, iteration: int) -> Path:
        """One update's folder: `training/iter_<NNNN>/` (its files: training.update.RunPaths)."""
        return self.root / "training" / iteration_name(iteration)

    policy = property(lambda self: self.root / "policy")
    policy_current = property(lambda self: self.policy / "current")
    policy_best = property(lambda self: self.policy / "best")
    #: the model every start of this log path serves and trains (coordinator.model)
    model = property(lambda self: self.root / "model.json")

    def policy_version(self, version: int) -> Path:
        return self.policy / version_name(version)

    # several nodes
    cluster = property(lambda self: self.root / "cluster")
    run_record = property(lambda self: self.cluster / "run.json")
    pinned = property(lambda self: self.cluster / "pinned.json")

    def cluster_run(self, run_id: str) -> ClusterRun:
        return ClusterRun(self.cluster / "runs" / run_id)

    def role(self, group: str) -> Layout:
        """The protocol root of one role group of a split-role run (`roles/<group>/`)."""
        return Layout(self.root / "roles" / group)
