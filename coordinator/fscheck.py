"""What the shared log path's filesystem shows one node of another's writes: `run.sh --check-shared-fs`.

    findings = check(folder, rank, num_nodes, budget_s=8.0)     # every node at once; rank 0 leads
    problems = verdict(findings, dead_after_s=30, heartbeat_s=5)

Rank 0 (A) and each other rank (B) play through files of `folder` (`a.<r>.*` A's, `b.<r>.*` B's), on A's
clock and B's clock, never comparing the two directly:

1. A writes `a.<r>.ping`; B, looking both ways (listing and name), answers `b.<r>.pong` with the times it saw
   the ping and answered; A, looking both ways, sees it: the round trip, and B's clock offset from A's (NTP's
   estimate, within half the round trip).
2. Once every B answered or its wait ended, A writes `closed` (a B that comes later takes no part), and at one
   moment creates `a.<r>.name` and `a.<r>.list`, deletes `a.<r>.gone` and replaces `a.<r>.content` (temp file
   and rename, as every file of the protocol); B, who saw the old state in step 1, sees `closed` and watches
   each its own way (by name only, by listing only, by name, by content) until it sees the change or the
   budget ends, noting the time on its clock.
3. A holds an exclusive flock on `a.<r>.lock`; B tries it without blocking: taken means locks are not
   shared between the nodes.

B reports its times (`b.<r>.result`); A takes the delays on the two wall clocks (kept in step by NTP on a
cluster; the offset estimate is reported beside them, not subtracted: a slow way there or back skews it).
What the protocol needs from the filesystem, and what each finding means for it: docs/multinode.md
"Filesystems".
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rollout_engine.files import overwrite_text, save_text
from rollout_engine.shared_read import exists_either_way, read_fresh

#: how often a side looks (s)
POLL_S = 0.01
#: the things B watches in step 2, and how it looks for each
CHANGES = ("name", "listing", "deleted", "replaced")
#: the PairFindings field of each
FIELDS = ("new_by_name_s", "new_by_listing_s", "deleted_visible_s", "old_content_s")
#: rank 0's findings, in the check's folder
FINDINGS = "findings.json"


@dataclass
class PairFindings:
    """What rank `rank` saw of rank 0's writes; a delay None: not seen within the budget."""

    rank: int
    host: str
    round_trip_s: float | None = None
    clock_offset_s: float | None = None
    new_by_name_s: float | None = None
    new_by_listing_s: float | None = None
    deleted_visible_s: float | None = None
    old_content_s: float | None = None
    locks_shared: bool | None = None


@dataclass
class Findings:
    """The check as rank 0 saw it: one PairFindings per other rank, and the budget each wait had."""

    budget_s: float
    folder: str
    pairs: list[PairFindings] = field(default_factory=list)

    def worst(self, name: str) -> float | None:
        """The largest delay of `name` over the pairs; None when a pair did not see it in time (or no pair)."""
        values = [getattr(pair, name) for pair in self.pairs]
        return None if not values or None in values else max(values)

    def to_json(self) -> dict:
        return asdict(self)


def save_findings(folder: Path, findings: Findings) -> Path:
    """Write the findings beside the check's files (`findings.json`, which the other ranks may read)."""
    path = folder / FINDINGS
    save_text(path, json.dumps(findings.to_json(), indent=1) + "\n")
    return path


def load_findings(path: Path) -> Findings:
    """The findings another rank wrote (FileNotFoundError, ValueError or KeyError while they are not there)."""
    data = json.loads(read_fresh(path))
    return Findings(data["budget_s"], data["folder"], [PairFindings(**pair) for pair in data["pairs"]])


def _wait(condition: Callable[[], bool], deadline: float) -> float | None:
    """Poll until `condition`; the time.time() it held, or None at the deadline."""
    while True:
        if condition():
            return time.time()
        if time.time() > deadline:
            return None
        time.sleep(POLL_S)


def _write(path: Path, data: dict) -> None:
    save_text(path, json.dumps(data) + "\n", durable=False)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(read_fresh(path))
    except (FileNotFoundError, ValueError):
        return None


def _answers(folder: Path, ranks: list[int], name: str, deadline: float) -> dict[int, tuple[float, dict]]:
    """Each rank's `b.<r>.<name>` as it appears (looked for both ways), with the time.time() it was seen."""
    found: dict[int, tuple[float, dict]] = {}
    while len(found) < len(ranks) and time.time() < deadline:
        for r in ranks:
            path = folder / f"b.{r}.{name}"
            if r not in found and exists_either_way(path) and (answer := _read(path)):
                found[r] = (time.time(), answer)
        time.sleep(POLL_S)
    return found


def checked_ranks(num_nodes: int, most: int) -> list[int]:
    """The ranks a check of `num_nodes` pings: every other rank up to `most`, else `most` spread evenly from rank 1
    to the last (each ping is seven files at rank 0 and two 10 ms polls at the rank: a start's check stays the
    same size at any N, and a filesystem's clients are alike enough for a sample)."""
    others = num_nodes - 1
    if others <= most:
        return list(range(1, num_nodes))
    return [1 + round(i * (others - 1) / (most - 1)) for i in range(most)]


def lead(
    folder: Path, num_nodes: int, budget_s: float, wait_s: float | None = None, ranks: list[int] | None = None
) -> Findings:
    """Rank 0's side for every other rank at once, or for `ranks` (waiting `wait_s`, default `budget_s`, for them
    to answer); returns what each saw. Once it stops waiting for answers it writes `closed`: a rank that comes
    later keeps out (`follow` returns at once)."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = list(range(1, num_nodes)) if ranks is None else ranks
    for r in ranks:
        _write(folder / f"a.{r}.gone", {})
        _write(folder / f"a.{r}.content", {"version": 1})
        (folder / f"a.{r}.lock").touch()
    pinged = {r: time.time() for r in ranks}
    for r in ranks:
        _write(folder / f"a.{r}.ping", {"time": pinged[r]})
    ponged = _answers(folder, list(ranks), "pong", time.time() + (budget_s if wait_s is None else wait_s))
    _write(folder / "closed", {"answered": sorted(ponged)})
    changed = time.time()
    for r in ponged:
        _write(folder / f"a.{r}.name", {})
        _write(folder / f"a.{r}.list", {})
        (folder / f"a.{r}.gone").unlink()
        overwrite_text(folder / f"a.{r}.content", json.dumps({"version": 2}) + "\n")  # as a heartbeat is
    locks = {}
    for r in ponged:
        locks[r] = os.open(folder / f"a.{r}.lock", os.O_RDWR)
        fcntl.flock(locks[r], fcntl.LOCK_EX)
        _write(folder / f"a.{r}.locked", {"changed": changed})
    # the follower's watch, then its wait for the lock
    results = {
        r: answer for r, (_, answer) in _answers(folder, list(ponged), "result", time.time() + 2 * budget_s + 2).items()
    }
    for fd in locks.values():
        os.close(fd)
    findings = Findings(budget_s, str(folder))
    for r in ranks:
        pair = PairFindings(r, "")
        if r in ponged:
            back, pong = ponged[r]
            pair.host = pong.get("host", "")
            # NTP's estimate: the way there and the way back, B's time between them taken out
            pair.round_trip_s = round((back - pinged[r]) - (pong["time"] - pong["seen"]), 3)
            pair.clock_offset_s = round(((pong["seen"] - pinged[r]) + (pong["time"] - back)) / 2, 3)
        result = results.get(r)
        if result is not None:
            # on the two nodes' wall clocks (a cluster's are kept in step by NTP): the offset estimated above
            # is reported, not subtracted, for one slow direction (a cached absence) skews it by seconds
            for name, attr in zip(CHANGES, FIELDS, strict=True):
                seen = result["seen"].get(name)
                if seen is not None:
                    setattr(pair, attr, round(max(0.0, seen - changed), 3))
            pair.locks_shared = result.get("locks_shared")
        findings.pairs.append(pair)
    return findings


def follow(
    folder: Path, rank: int, budget_s: float, wait_s: float | None = None, stop: threading.Event | None = None
) -> None:
    """Rank `rank`'s side, waiting `wait_s` (default `budget_s`) for rank 0's ping (its answers are rank 0's to
    read); `stop` set ends that wait."""
    deadline = time.time() + (budget_s if wait_s is None else wait_s)
    ping, closed = folder / f"a.{rank}.ping", folder / "closed"

    def pinged_or_over() -> bool:
        over = (stop is not None and stop.is_set()) or exists_either_way(closed)
        return over or (exists_either_way(ping) and _read(ping) is not None)

    pinged = _wait(pinged_or_over, deadline)
    if pinged is None or exists_either_way(closed) or (stop is not None and stop.is_set()):
        return  # rank 0 never showed up, or stopped waiting for answers: its findings say so
    # the old state, seen before it changes: the gone file exists, the content is version 1
    gone, content = folder / f"a.{rank}.gone", folder / f"a.{rank}.content"
    _wait(lambda: gone.exists() and (_read(content) or {}).get("version") == 1, time.time() + budget_s)
    # look the new names up before they exist, as a waiter at a barrier does: a client may cache their absence
    (folder / f"a.{rank}.name").exists()
    f"a.{rank}.list" in os.listdir(folder)  # noqa: B015
    _write(folder / f"b.{rank}.pong", {"seen": pinged, "time": time.time(), "host": socket.gethostname()})
    # rank 0 changes the files once every rank answered or its wait ended (`closed`): the watch starts then
    _wait(lambda: exists_either_way(closed) or (stop is not None and stop.is_set()), time.time() + (wait_s or budget_s))
    look = {
        "name": lambda: (folder / f"a.{rank}.name").exists(),
        "listing": lambda: f"a.{rank}.list" in os.listdir(folder),
        "deleted": lambda: not gone.exists(),
        "replaced": lambda: (_read(content) or {}).get("version") == 2,
    }
    seen: dict[str, float | None] = dict.fromkeys(CHANGES)
    deadline = time.time() + budget_s
    while None in seen.values() and time.time() < deadline:
        for name, check in look.items():
            if seen[name] is None and check():
                seen[name] = time.time()
        time.sleep(POLL_S)
    shared = None
    locked = folder / f"a.{rank}.locked"
    if _wait(lambda: exists_either_way(locked), time.time() + budget_s) is not None:
        fd = os.open(folder / f"a.{rank}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shared = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            shared = True
        finally:
            os.close(fd)
    _write(folder / f"b.{rank}.result", {"seen": seen, "locks_shared": shared})


def summary(findings: Findings) -> str:
    """One line for a run's log: the worst of each finding over the ranks that answered."""
    answered = [pair for pair in findings.pairs if pair.round_trip_s is not None]
    if not answered:
        return f"no other rank answered within the check's wait ({findings.budget_s:g} s per look)"

    def worst(name: str) -> str:
        value = Findings(findings.budget_s, findings.folder, answered).worst(name)
        return f"more than {findings.budget_s:g} s" if value is None else f"{value:.2f} s"

    shared = {pair.locks_shared for pair in answered}
    locks = "yes" if shared == {True} else "no (each node locks alone)" if False in shared else "unknown"
    offset = max(abs(pair.clock_offset_s or 0.0) for pair in answered)
    late = [pair.rank for pair in findings.pairs if pair.round_trip_s is None]
    return (
        f"ranks {_ranks([pair.rank for pair in answered])} see rank 0's writes: a new file by name"
        f" {worst('new_by_name_s')}, by listing {worst('new_by_listing_s')}; a deleted file for"
        f" {worst('deleted_visible_s')}; a rewritten file's old content for {worst('old_content_s')}; locks shared:"
        f" {locks}; clocks within {offset:.3f} s" + (f"; not in time: ranks {_ranks(late)}" if late else "")
    )


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(rank) for rank in ranks)


def verdict(findings: Findings, dead_after_s: float, heartbeat_s: float) -> list[str]:
    """What the findings refuse: each problem names the setting, the measured staleness and the fix. A rank that
    did not answer rank 0's ping took no part: it adds nothing (the findings name it)."""
    answered = [pair for pair in findings.pairs if pair.round_trip_s is not None]
    findings = Findings(findings.budget_s, findings.folder, answered)
    problems = []
    old = findings.worst("old_content_s")
    # a heartbeat is a file rewritten every heartbeat_s; another node sees each change up to `old` late, so the
    # changes it sees can be heartbeat_s + old apart: a node is dead only after more than that, and a beat more
    need = 2 * heartbeat_s + (findings.budget_s if old is None else old)
    if findings.pairs and dead_after_s <= need:
        seen = f"more than {findings.budget_s:.0f} s" if old is None else f"{old:.1f} s"
        problems.append(
            f"BATON_DEAD_AFTER_S={dead_after_s:g} is too short here: another node saw a rewritten file's old content "
            f"for {seen} (heartbeats every {heartbeat_s:g} s), so a live node could be counted dead. Set "
            f"BATON_DEAD_AFTER_S to {math.floor(need) + 1} or more, or mount the log path with shorter attribute "
            'caches (NFS: actimeo=1; GlusterFS: --attribute-timeout=1; docs/multinode.md "Filesystems")'
        )
    by_name, by_listing = findings.worst("new_by_name_s"), findings.worst("new_by_listing_s")
    if by_name is None and by_listing is None and findings.pairs:
        problems.append(
            f"a new file of another node was seen neither by name nor by listing within {findings.budget_s:.0f} s: "
            "every barrier would wait that long. Mount the log path with shorter entry caches (NFS: lookupcache="
            "positive, acdirmax=1; GlusterFS: --entry-timeout=1 --negative-timeout=1; docs/multinode.md)"
        )
    return problems
