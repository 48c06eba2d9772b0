"""bench/fs_real.py: the cluster's phase read from what the nodes leave in the brick (engine groups, markers)."""

from __future__ import annotations

from pathlib import Path

from bench.fs_real import Node, observe
from coordinator import groupfile
from rollout_engine.layout import Layout


class Running:
    """A node's process that runs (poll() -> None) or has exited with `code`."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def _engine(seen: Path, rank: int, running: bool) -> None:
    path = Layout(seen).groups(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(groupfile.encode({"rollout-train": groupfile.Record(1000 + rank, "")} if running else {}))


def _mark(seen: Path, phase: str) -> None:
    path = seen / "run" / "state" / "iter_0001" / f"{phase}.done"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("done\n")


def test_phases_of_a_run_with_an_update_from_start_to_end(tmp_path: Path) -> None:
    nodes = [Node(rank, Running(), tmp_path / f"node{rank}.log") for rank in range(3)]  # type: ignore[arg-type]
    assert observe(nodes, tmp_path, both=True) == "start"
    for rank in range(3):
        _engine(tmp_path, rank, True)
    assert observe(nodes, tmp_path, both=True) == "rollout"
    _engine(tmp_path, 0, False)
    assert observe(nodes, tmp_path, both=True) == "arrivals"
    _engine(tmp_path, 1, False)
    assert observe(nodes, tmp_path, both=True) == "barrier"  # every rank but the slow one waits
    _engine(tmp_path, 2, False)
    assert observe(nodes, tmp_path, both=True) == "end"  # every share done, the master not yet marked it
    _mark(tmp_path, "train_rollout")
    assert observe(nodes, tmp_path, both=True) == "update"
    assert observe(nodes, tmp_path) == "end"  # a rollout-only run has no update phase
    _mark(tmp_path, "update")
    assert observe(nodes, tmp_path, both=True) == "end"
