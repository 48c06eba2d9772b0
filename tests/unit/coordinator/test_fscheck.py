"""coordinator/fscheck.py: the check between two threads on the local disk (every change seen within the
budget, locks shared), and the verdict's arithmetic on given findings."""

from __future__ import annotations

import threading
from pathlib import Path

from coordinator.fscheck import Findings, PairFindings, checked_ranks, follow, lead, summary, verdict


def test_two_processes_on_one_disk_see_every_change_at_once_and_share_locks(tmp_path: Path) -> None:
    folder = tmp_path / "check"
    folder.mkdir()
    other = threading.Thread(target=follow, args=(folder, 1, 5.0))
    other.start()
    findings = lead(folder, 2, 5.0)
    other.join()
    (pair,) = findings.pairs
    assert pair.rank == 1 and pair.locks_shared is True
    for name in ("round_trip_s", "clock_offset_s", "new_by_name_s", "new_by_listing_s", "deleted_visible_s"):
        assert getattr(pair, name) is not None, (name, pair)  # seen within the budget (how soon: bench/)
    assert pair.old_content_s is not None


def test_a_start_check_on_many_nodes_checks_a_bounded_spread_of_ranks_and_the_others_write_nothing(
    tmp_path: Path,
) -> None:
    """At 1,000 nodes the start's check pings 8 ranks spread over the cluster, not 999 (each ping is 7 files at the
    master and two polls every 10 ms at the rank); every rank checked at 9 nodes or fewer."""
    assert checked_ranks(2, 8) == [1] and checked_ranks(9, 8) == list(range(1, 9))
    spread = checked_ranks(1000, 8)
    assert len(spread) == 8 and spread[0] == 1 and spread[-1] == 999 and spread == sorted(set(spread))
    assert checked_ranks(10, 8) == [1, 2, 3, 4, 6, 7, 8, 9]

    folder = tmp_path / "check"
    folder.mkdir()
    ranks = checked_ranks(12, 3)  # [1, 6, 11]
    others = [threading.Thread(target=follow, args=(folder, r, 5.0)) for r in ranks]
    for thread in others:
        thread.start()
    found = lead(folder, 12, 5.0, ranks=ranks)
    for thread in others:
        thread.join()
    assert [pair.rank for pair in found.pairs] == ranks and all(p.locks_shared for p in found.pairs)
    named = {path.name.split(".")[1] for path in folder.iterdir() if path.name.startswith(("a.", "b."))}
    assert named == {str(r) for r in ranks}  # no file of an unchecked rank


def findings(**pair: float | None) -> Findings:
    return Findings(8.0, "/log/fscheck/x", [PairFindings(1, "node1", 0.01, 0.0, **pair)])


def test_the_verdict_refuses_a_dead_after_two_beats_and_the_staleness_reach() -> None:
    fresh = findings(new_by_name_s=0.0, new_by_listing_s=None, deleted_visible_s=None, old_content_s=5.0)
    assert verdict(fresh, dead_after_s=30, heartbeat_s=5) == []  # 2 x 5 + 5 = 15 < 30
    (problem,) = verdict(fresh, dead_after_s=15, heartbeat_s=5)
    assert problem.startswith("BATON_DEAD_AFTER_S=15 is too short here: another node saw a rewritten file's old")
    assert "for 5.0 s (heartbeats every 5 s)" in problem and "Set BATON_DEAD_AFTER_S to 16 or more" in problem
    (problem,) = verdict(findings(new_by_name_s=0.0, old_content_s=1.04), dead_after_s=2, heartbeat_s=1)
    assert "Set BATON_DEAD_AFTER_S to 4 or more" in problem  # 2 x 1 + 1.04 = 3.04: more than 3, not "above 3"
    never = findings(new_by_name_s=None, new_by_listing_s=None, deleted_visible_s=None, old_content_s=None)
    problems = verdict(never, dead_after_s=30, heartbeat_s=5)  # 2 x 5 + the 8 s wait = 18 < 30: only the names
    assert len(problems) == 1 and "seen neither by name nor by listing within 8 s" in problems[0]
    assert len(verdict(never, dead_after_s=18, heartbeat_s=5)) == 2
    # a rank that never answered the ping (it started after rank 0 stopped waiting) took no part
    late = Findings(8.0, "/log/fscheck/x", [*fresh.pairs, PairFindings(2, "")])
    assert verdict(late, dead_after_s=30, heartbeat_s=5) == []
    assert summary(late).endswith("locks shared: unknown; clocks within 0.000 s; not in time: ranks 2")
    assert summary(late).startswith("ranks 1 see rank 0's writes: a new file by name 0.00 s, by listing more than 8 s")
