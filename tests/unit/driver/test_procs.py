"""coordinator/driver/procs.py: recorded process groups are stopped exactly, children included, and
nothing that was not recorded (an outsider, a reused pid) is ever signalled; role claims.

Real processes throughout (sleep, bash, python); the group records are read back through their format's
module (coordinator/groupfile.py), as the dashboard and the tests read them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from coordinator import groupfile
from coordinator.driver import procs, say
from coordinator.driver.procs import (
    Claimed,
    Groups,
    LockBusy,
    child_env,
    claim,
    group_alive,
    group_listens,
    group_ours,
    release,
    start_time,
)
from rollout_engine.layout import GROUPS_NAME
from tests.unit.driver.fakes import running, wait_for


def record(run_dir: Path, name: str, pgid: int, start: str) -> None:
    """Write a record as an earlier run (or another process) left it, beside the records already there."""
    records = groupfile.read(run_dir / GROUPS_NAME)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / GROUPS_NAME).write_bytes(groupfile.encode({**records, name: groupfile.Record(pgid, start)}))


def members(pgid: int) -> list[int]:
    """The pids of group `pgid`, as pgrep sees them (independent of the code under test)."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, check=False)
    return [int(pid) for pid in out.stdout.split()]


def test_start_records_a_group_whose_children_stop_ends(
    groups: Groups, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = groups.start("job", ["bash", "-c", "sleep 300 & sleep 300 & wait"], run_dir / "logs" / "job.log")
    assert job.pgid == job.popen.pid and os.getpgid(job.pgid) == job.pgid
    assert groupfile.read(run_dir / GROUPS_NAME) == {"job": groupfile.Record(job.pgid, start_time(job.pgid) or "")}
    assert groups.recorded("job") == (job.pgid, job.start) and groups.group("job") is job
    wait_for(lambda: len(members(job.pgid)) >= 3, "bash and its two sleeps")
    assert groups.leader_alive("job") and group_alive(job.pgid)

    groups.stop("job", 5)

    assert capsys.readouterr().err == ""  # gone on SIGTERM: the leader's zombie, until reaped, is not alive
    assert not group_alive(job.pgid)
    wait_for(lambda: members(job.pgid) == [], "the sleeps' zombies to be reaped by init")
    assert groupfile.read(run_dir / GROUPS_NAME) == {}
    assert groups.group("job") is None and job.poll() is not None  # reaped: no zombie left


def test_stop_escalates_to_sigkill_for_a_group_that_ignores_sigterm(
    groups: Groups, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = groups.start("stubborn", ["bash", "-c", 'trap "" TERM; sleep 300 & wait'], run_dir / "s.log")
    wait_for(lambda: len(members(job.pgid)) >= 2, "bash and its sleep")

    groups.stop("stubborn", 1)

    assert f"[baton] warning: stubborn (group {job.pgid}) ignored SIGTERM for 1s; sending SIGKILL" in (
        capsys.readouterr().err
    )
    assert not group_alive(job.pgid)
    assert job.poll() == 128 + signal.SIGKILL


def test_stop_a_stopped_group_handles_its_sigterm_at_once(
    groups: Groups, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    term, ready = tmp_path / "term", tmp_path / "ready"
    script = f"trap 'echo handled >{term}; exit 0' TERM; : >{ready}; while :; do sleep 0.1; done"
    job = groups.start("frozen", ["bash", "-c", script], run_dir / "f.log")
    wait_for(ready.exists, "the trap to be set")
    os.killpg(job.pgid, signal.SIGSTOP)

    began = time.monotonic()
    groups.stop("frozen", 10)

    assert time.monotonic() - began < 5
    assert "ignored SIGTERM" not in capsys.readouterr().err
    assert term.read_text() == "handled\n"
    assert not group_alive(job.pgid)


def test_stop_leaves_processes_it_did_not_start_alone(groups: Groups, run_dir: Path, outsiders) -> None:
    outsider = outsiders("sleep", "300")  # in the test's own group: stopping a group must not reach it
    job = groups.start("job", ["sleep", "300"], run_dir / "job.log")

    groups.stop("job", 5)

    assert not group_alive(job.pgid)
    assert outsider.poll() is None


def test_an_unknown_name_is_a_no_op(groups: Groups, run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    groups.stop("nothing")
    groups.stop_stale("nothing")
    groups.forget("nothing")
    assert groups.recorded("nothing") is None and groups.group("nothing") is None
    assert not groups.leader_alive("nothing") and not groups.signal("nothing", signal.SIGTERM)
    assert capsys.readouterr().err == ""


def test_stop_stale_stops_a_group_whose_recorded_leader_still_runs(
    groups: Groups, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = groups.start("left", ["bash", "-c", "sleep 300 & wait"], run_dir / "l.log")
    wait_for(lambda: len(members(job.pgid)) >= 2, "bash and its sleep")
    earlier = Groups(run_dir)  # the new run: it did not start the group, it only reads the record

    earlier.stop_stale("left")

    assert f"[baton] warning: left (group {job.pgid}) was left running by an earlier run; stopping it" in (
        capsys.readouterr().err
    )
    assert not group_alive(job.pgid) and groups.recorded("left") is None


def test_a_phase_start_makes_no_name_on_the_log_path_after_the_nodes_first(
    groups: Groups, run_dir: Path, tmp_path: Path
) -> None:
    # every node starts a phase's group at once after a barrier: a file a group was N creates and N unlinks
    first = groups.start("rollout-train", ["sleep", "300"], tmp_path / "a.log")
    file = run_dir / GROUPS_NAME
    inode = file.stat().st_ino
    groups.stop("rollout-train", 5)
    for name in ("rollout-test", "update", "vllm"):
        groups.start(name, ["sleep", "300"], tmp_path / f"{name}.log")
    groups.stop("update", 5)
    assert os.listdir(run_dir) == [GROUPS_NAME] and file.stat().st_ino == inode
    assert sorted(groups.records()) == ["rollout-test", "vllm"] and groups.group("rollout-train") is None
    assert not group_alive(first.pgid)


def test_what_a_group_holds_lives_in_its_record_and_goes_with_it(groups: Groups, run_dir: Path, tmp_path: Path) -> None:
    server = groups.start("vllm", ["sleep", "300"], tmp_path / "vllm.log")
    inode = (run_dir / GROUPS_NAME).stat().st_ino
    assert groups.holds("vllm") == ""
    groups.note("vllm", "/log/policy/v0001")
    groups.note("vllm", "/log/policy/v0002")  # an in-place reload: the record rewritten, no name made
    assert groups.holds("vllm") == "/log/policy/v0002" and groups.recorded("vllm") == (server.pgid, server.start)
    assert os.listdir(run_dir) == [GROUPS_NAME] and (run_dir / GROUPS_NAME).stat().st_ino == inode
    groups.note("update", "/elsewhere")  # no record of that group: nothing to note
    assert sorted(groups.records()) == ["vllm"]
    groups.stop("vllm", 5)
    assert groups.holds("vllm") == ""
    groups.start("vllm", ["sleep", "300"], tmp_path / "vllm.log")
    assert groups.holds("vllm") == ""  # a new server holds nothing until noted


def test_a_start_waits_for_the_records_lock_and_keeps_what_its_holder_wrote(
    groups: Groups, run_dir: Path, tmp_path: Path
) -> None:
    # the two runs of a split deployment record their groups in one rank directory, each under the file's lock
    record(run_dir, "vllm", 1, "1")
    fd = os.open(run_dir / GROUPS_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    started = threading.Thread(target=groups.start, args=("update", ["sleep", "300"], tmp_path / "u.log"))
    try:
        started.start()
        time.sleep(0.5)
        assert started.is_alive(), "the start did not wait for the lock"
        record(run_dir, "watch", 1, "1")  # the holder's own write, which the start must keep
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    started.join(10)
    assert sorted(groups.records()) == ["update", "vllm", "watch"]
    groups.forget("vllm")
    groups.forget("watch")


def test_a_start_whose_record_cannot_be_written_leaves_nothing_running(
    groups: Groups, run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a group no record names is one no clean-up would find
    monkeypatch.setattr(procs, "RECORDS_WAIT_S", 0.3)
    record(run_dir, "vllm", 1, "1")
    fd = os.open(run_dir / GROUPS_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(say.Die) as caught:
            groups.start("job", ["sleep", "300.77"], tmp_path / "job.log")
    finally:
        os.close(fd)
    assert caught.value.code == 1 and f"the lock {run_dir / GROUPS_NAME} to record the group job" in str(
        caught.value.message
    )
    assert not running("sleep 300.77") and sorted(groups.records()) == ["vllm"]
    groups.forget("vllm")


def test_stop_stale_only_forgets_a_record_whose_pid_was_reused(
    groups: Groups, run_dir: Path, outsiders, capsys: pytest.CaptureFixture[str]
) -> None:
    other = outsiders("sleep", "300")
    record(run_dir, "reused", other.pid, "1")

    groups.stop_stale("reused")

    assert other.poll() is None
    assert groups.recorded("reused") is None
    assert capsys.readouterr().err == ""


def test_stop_stale_never_signals_members_that_outlived_their_leader(
    groups: Groups, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = groups.start("orphans", ["bash", "-c", "sleep 300 & echo started"], run_dir / "o.log")
    wait_for(lambda: job.poll() is not None, "the leader to exit")  # reaped: its pid names nothing now
    wait_for(lambda: members(job.pgid) != [], "the sleep it left")
    try:
        Groups(run_dir).stop_stale("orphans")

        assert capsys.readouterr().err == (
            f"[baton] warning: orphans: recorded group {job.pgid} outlived its leader; not ours to stop, check it\n"
        )
        assert group_alive(job.pgid) and groups.recorded("orphans") is None
    finally:
        os.killpg(job.pgid, signal.SIGKILL)


def test_stop_never_signals_a_recorded_pid_that_now_names_another_process(
    groups: Groups, run_dir: Path, outsiders, capsys: pytest.CaptureFixture[str]
) -> None:
    other = outsiders("sleep", "300", new_session=True)  # a group of that id runs, but not the recorded one
    record(run_dir, "job", other.pid, "1")  # the job ended and its pid was reused

    groups.stop("job", 1)

    assert other.poll() is None
    assert capsys.readouterr().err == (
        f"[baton] warning: job: the recorded pid {other.pid} now names another process; not signalled\n"
    )
    assert groups.recorded("job") is None


def test_group_ours_tells_a_reused_pid_from_members_that_outlived_their_leader(outsiders) -> None:
    other = outsiders("sleep", "300", new_session=True)
    assert group_ours(other.pid, start_time(other.pid) or "")
    assert not group_ours(other.pid, "1")
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    assert group_ours(gone, "1")
    assert not group_ours(0, "1") and not group_ours(1, start_time(1) or "")


def test_signal_sends_only_to_a_live_recorded_group(groups: Groups, run_dir: Path) -> None:
    job = groups.start("job", ["sleep", "300"], run_dir / "job.log")
    assert groups.signal("job", signal.SIGKILL)
    wait_for(lambda: job.poll() is not None, "the killed sleep")
    assert job.poll() == 128 + signal.SIGKILL
    assert not groups.signal("job", signal.SIGTERM)  # nothing of the group runs any more
    assert not groups.signal("other", signal.SIGTERM)


def test_poll_gives_the_leaders_exit_code(groups: Groups, run_dir: Path) -> None:
    job = groups.start("fails", ["bash", "-c", "exit 3"], run_dir / "x.log")
    wait_for(lambda: job.poll() is not None, "bash to exit")
    assert job.poll() == 3
    groups.forget("fails")
    assert groups.recorded("fails") is None and groups.group("fails") is None


def test_the_child_reads_dev_null_and_appends_to_its_log(groups: Groups, run_dir: Path) -> None:
    log = run_dir / "logs" / "deep" / "cat.log"
    for word in ("one", "two"):
        job = groups.start("cat", ["bash", "-c", f"cat; echo {word}; echo {word}-err >&2"], log)
        wait_for(lambda job=job: job.poll() is not None, "cat to read an empty stdin")
        assert job.poll() == 0
    assert log.read_text() == "one\none-err\ntwo\ntwo-err\n"


def test_without_a_log_the_output_goes_to_the_drivers_stderr(
    groups: Groups, run_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    job = groups.start("loud", ["bash", "-c", "echo out; echo err >&2"], None)
    wait_for(lambda: job.poll() is not None, "bash to exit")
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", "out\nerr\n")


def test_env_is_inherited_or_given_exactly(
    groups: Groups, run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_TEST_INHERITED", "yes")
    env = shutil.which("env") or "/usr/bin/env"
    job = groups.start("inherits", [env], tmp_path / "inherits.log")
    wait_for(lambda: job.poll() is not None, "env to exit")
    assert "BATON_TEST_INHERITED=yes\n" in (tmp_path / "inherits.log").read_text()

    job = groups.start("exact", [env], tmp_path / "exact.log", env={"ONLY": "this"})
    wait_for(lambda: job.poll() is not None, "env to exit")
    assert (tmp_path / "exact.log").read_text() == "ONLY=this\n"


def test_group_returns_the_started_group_only_while_the_record_names_it(groups: Groups, run_dir: Path) -> None:
    first = groups.start("job", ["sleep", "300"], run_dir / "job.log")
    record(run_dir, "job", 1, "1")  # someone else's record under that name now
    assert groups.group("job") is None
    record(run_dir, "job", first.pgid, first.start)
    assert groups.group("job") is first
    groups.stop("job", 5)
    assert groups.group("job") is None


def test_listens_names_the_group_holding_the_listening_socket(groups: Groups, run_dir: Path, tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    server = (
        "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        f"open('{port_file}', 'w').write(str(s.getsockname()[1])); time.sleep(300)"
    )
    # the listener is a child of the group's leader, not the leader itself
    job = groups.start("server", ["bash", "-c", f'{sys.executable} -c "{server}" & wait'], run_dir / "s.log")
    wait_for(lambda: port_file.exists() and port_file.read_text() != "", "the server's port")
    port = int(port_file.read_text())
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        ours.listen()
        other_port = ours.getsockname()[1]

        assert groups.listens("server", port)
        assert not groups.listens("server", other_port)  # a socket of another group
        assert group_listens(os.getpgrp(), other_port) and not group_listens(os.getpgrp(), port)
    assert not group_listens(job.pgid, other_port)  # closed: nothing listens there
    assert not groups.listens("nothing", port)


def test_start_time_is_the_processes_start_even_with_a_parenthesis_in_its_name(
    groups: Groups, run_dir: Path, tmp_path: Path
) -> None:
    odd = tmp_path / "a) b"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    job = groups.start("odd", [str(odd), "300"], run_dir / "odd.log")
    ticks = start_time(job.pgid)
    assert ticks is not None and ticks.isdigit()
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line[:6] == "btime ")
    started = boot + int(ticks) / os.sysconf("SC_CLK_TCK")
    assert abs(started - time.time()) < 30  # it started just now (a misparsed field would be far off)
    assert group_alive(job.pgid) and groups.leader_alive("odd")  # the state and group fields parse too
    assert start_time(int(Path("/proc/sys/kernel/pid_max").read_text()) + 1) is None


def owner_text(pid: int) -> str:
    return f"{socket.gethostname()} {pid} {start_time(pid)}\n"


def test_claim_a_record_locked_past_the_wait_names_it_and_claims_nothing(run_dir: Path) -> None:
    """The claim locks the role's record itself: one file a role, made with one create (no lock file, no temp file
    and rename: every node's start on the shared path)."""
    run_dir.mkdir(parents=True)
    record = run_dir / "owner.update"
    with open(record, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: flock conflicts as with another process
        with pytest.raises(LockBusy) as busy:
            claim(run_dir, "update", 1)
    assert busy.value.message == (
        f"[baton] error: waited 1s for the lock {record} to claim update; another process holds it "
        f"(check: fuser {record})"
    )
    assert record.read_text() == ""

    claim(run_dir, "update", 1)
    claim(run_dir, "rollout", 1)

    assert record.read_text() == owner_text(os.getpid())
    assert sorted(p.name for p in run_dir.iterdir()) == ["owner.rollout", "owner.update"]


def test_a_claim_waiting_on_a_record_its_owner_releases_writes_the_record_that_is_there_then(run_dir: Path) -> None:
    """An owner that ends removes its record under the record's lock; a claim that waited on that lock then holds a
    file no longer named: it claims the name anew, so that its record is the one others read."""
    run_dir.mkdir(parents=True)
    record = run_dir / "owner.rollout"
    record.write_text(owner_text(os.getpid()))
    with open(record, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        timer = threading.Timer(0.3, lambda: (record.unlink(), held.close()))  # the owner's release
        timer.start()
        claim(run_dir, "rollout", 5)
        timer.join()
    assert record.read_text() == owner_text(os.getpid())


def test_claim_refuses_a_live_owner_and_takes_over_a_dead_one(run_dir: Path, outsiders) -> None:
    owner = outsiders("sleep", "300")
    run_dir.mkdir(parents=True)
    record = run_dir / "owner.rollout"
    record.write_text(owner_text(owner.pid))
    with pytest.raises(Claimed) as claimed:
        claim(run_dir, "rollout")
    assert claimed.value.owner_pid == owner.pid
    assert record.read_text() == owner_text(owner.pid)

    record.write_text(f"{socket.gethostname()} {owner.pid} 1\n")  # its pid was reused: that owner is gone
    claim(run_dir, "rollout")
    assert record.read_text() == owner_text(os.getpid())
    claim(run_dir, "rollout")  # this process's own claim again
    record.write_text(f"elsewhere {owner.pid} {start_time(owner.pid)}\n")  # another host's pid says nothing here
    claim(run_dir, "rollout")
    assert record.read_text() == owner_text(os.getpid())


def test_release_forgets_only_this_processes_claim(run_dir: Path, outsiders) -> None:
    owner = outsiders("sleep", "300")
    run_dir.mkdir(parents=True)
    record = run_dir / "owner.update"
    record.write_text(owner_text(owner.pid))
    release(run_dir, "update")
    assert record.exists()
    record.unlink()
    claim(run_dir, "update")
    release(run_dir, "update")
    assert not record.exists()
    release(run_dir, "update")  # nothing to release: fine


def test_a_child_s_pythonpath_is_the_repository_then_the_user_s_folders_each_once() -> None:
    """The user's own packages (an environment of theirs) stay importable in every child; the repository
    comes first, so nothing of theirs shadows Baton."""
    assert child_env("/repo", {"HOME": "/h"}) == {"HOME": "/h", "PYTHONPATH": "/repo"}
    theirs = {"PYTHONPATH": "/mine:/repo::/other:/mine"}
    assert child_env("/repo", theirs)["PYTHONPATH"] == "/repo:/mine:/other"
