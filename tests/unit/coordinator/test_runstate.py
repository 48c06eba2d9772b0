"""A run's iteration state on disk: the eval schedule, the numbering, the markers the driver writes."""

from __future__ import annotations

from pathlib import Path

from coordinator import runstate


def test_eval_schedule_is_iteration_mod_n_equal_1_and_n_1_evaluates_every_iteration() -> None:
    assert [n for n in (1, 2, 3, 4, 5, 6, 7, 8, 13) if runstate.eval_due(n, 6)] == [1, 7, 13]
    assert [n for n in (1, 2, 3) if runstate.eval_due(n, 1)] == [1, 2, 3]
    assert [n for n in (1, 2, 3, 4, 5) if runstate.eval_due(n, 2)] == [1, 3, 5]


def test_numbers_persist_a_finished_iteration_is_followed_by_the_next_an_unfinished_one_continued(
    tmp_path: Path,
) -> None:
    assert runstate.next_iteration(tmp_path) == 1
    runstate.mark(tmp_path, 1, "train_rollout")
    assert runstate.next_iteration(tmp_path) == 1
    runstate.mark(tmp_path, 1, "iteration")
    assert runstate.next_iteration(tmp_path) == 2
    (tmp_path / "run/state/iter_0010").mkdir(parents=True)
    assert runstate.state_iterations(tmp_path)[-1] == 10


def test_a_new_iteration_missing_from_a_cached_listing_is_found_by_name(tmp_path: Path, monkeypatch) -> None:
    """A split deployment's update run lists the rollout master's state folders; sshfs lists a new one up to
    20 s late, and the update run must not wait for that."""
    for n in (1, 2, 3):
        runstate.mark(tmp_path, n, "train_rollout")
    listed = runstate.iterations
    monkeypatch.setattr(runstate, "iterations", lambda folder: listed(folder)[:1])  # the listing a client cached
    assert runstate.state_iterations(tmp_path) == [1, 2, 3]
    monkeypatch.setattr(runstate, "iterations", lambda folder: [])
    assert runstate.state_iterations(tmp_path) == [1, 2, 3]


def test_markers_hold_what_the_phase_did_and_a_restart_forgets_an_interrupted_iterations_phases(
    tmp_path: Path,
) -> None:
    runstate.mark(tmp_path, 3, "update", "promoted v2")
    assert (tmp_path / "run/state/iter_0003/update.done").read_text() == "promoted v2\n"
    assert runstate.is_done(tmp_path, 3, "update") and not runstate.is_done(tmp_path, 3, "serve")
    runstate.add_time(tmp_path, 3, "update", 12.7)
    assert runstate.load_times(tmp_path, 3) == [("update", 12.0)]
    assert runstate.restart(tmp_path, 3) is True
    assert not runstate.is_done(tmp_path, 3, "update")
    assert not (tmp_path / "run/state/iter_0003/times").exists()
    assert not list((tmp_path / "run/state/iter_0003").glob(".*"))
    assert runstate.restart(tmp_path, 3) is False  # nothing left to forget: no warning to give


def test_a_marker_without_content_holds_the_time_it_was_written(tmp_path: Path) -> None:
    runstate.mark(tmp_path, 1, "serve")
    assert runstate.load_markers(tmp_path, 1)["serve"].isdigit()
