"""coordinator/fscheck.py: the check between two threads on the local disk (every change seen within the
budget, locks shared), and the verdict's arithmetic on given findings."""

from __future__ import annotations

import threading
from pathlib import Path

from coordinator.fscheck import Findings, PairFindings, follow, lead, summary, verdict


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
