"""bench/fs_names.py: which of a node's traced calls made a name on the log path, in which window."""

from __future__ import annotations

from pathlib import Path

from bench.fs_names import calls, names

L = "/tmp/L"
TRACE = f"""\
7 openat(AT_FDCWD, "{L}/run/rank_1/owner.rollout", O_RDWR|O_CREAT|O_CLOEXEC, 0644) = 3
7 mkdir("{L}/run/rank_1", 0777) = -1 EEXIST (File exists)
7 mkdir("{L}/run/rank_1/logs", 0777 <unfinished ...>
9 openat(AT_FDCWD, "/etc/hosts", O_RDONLY) = 4
7 <... mkdir resumed>) = 0
7 openat(AT_FDCWD, "{L}/run/rank_1/.resolved.yaml.0a1b2c3d.tmp", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 3
7 rename("{L}/run/rank_1/.resolved.yaml.0a1b2c3d.tmp", "{L}/run/rank_1/resolved.yaml") = 0
7 openat(AT_FDCWD, "{L}/run/rank_1/logs/vllm.log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0666) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/logs/vllm.log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0666) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/logs/iter_0001.train.log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0666) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/pids/rollout-train.pgid", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 3
7 openat(AT_FDCWD, "{L}/trajectories/train/iter_0001/rank_1.jsonl", O_WRONLY|O_CREAT|O_APPEND, 0666) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/pids/watch.pgid", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/pids/watch.pgid", O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/logs/iter_0002.train.log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0666) = 3
7 openat(AT_FDCWD, "{L}/run/rank_1/logs/late.log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0666) = 3
"""


def test_an_interrupted_call_is_joined_to_its_result(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.write_text(TRACE)
    joined = [line for line in calls(trace) if 'logs"' in line]
    assert joined == [f'7 mkdir("{L}/run/rank_1/logs", 0777) = 0']


def test_the_start_counts_to_the_first_rollouts_log_and_record(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.write_text(TRACE)
    kinds, made = names(trace, L, "start")
    # owner record, the temp file, the vLLM log once (opened twice), the rollout's log and its record; the folder
    # made (not the one that existed); the rename
    assert (kinds["C"], kinds["R"], kinds["D"]) == (5, 1, 1)
    assert made[-1] == f"C {L}/run/rank_1/pids/rollout-train.pgid"


def test_an_iteration_counts_from_its_rollouts_log_to_the_next_iterations(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.write_text(TRACE)
    kinds, made = names(trace, L, "iteration")
    assert [m.removeprefix(f"C {L}/") for m in made] == [
        "run/rank_1/logs/iter_0001.train.log",
        "run/rank_1/pids/rollout-train.pgid",
        "trajectories/train/iter_0001/rank_1.jsonl",
        "run/rank_1/pids/watch.pgid",
        "run/rank_1/pids/watch.pgid",  # made again after its unlink: an O_EXCL create is always a name
    ]
    assert sum(kinds.values()) == 5
