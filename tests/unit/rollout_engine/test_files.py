"""JSON lines: one torn-line rule for reading, appends that start on a line of their own."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_engine.files import LineAppender, append_jsonl, read_jsonl, save_jsonl, shared_lock
from rollout_engine.shared_read import STALE_TRIES, make_dirs, read_fresh

ROOT = Path(__file__).resolve().parents[3]


def test_a_torn_middle_line_is_skipped_alone(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"b": 2, "c": [1,\n{"d": 4}\n')
    read = read_jsonl(path)
    assert read.rows == [{"a": 1}, {"d": 4}]
    assert read.numbers == [1, 3]
    assert read.torn == [2]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": "caf\xc3')  # cut inside a multi-byte character
    read = read_jsonl(path)
    assert read.rows == [{"a": 1}]
    assert read.torn == [2]


def test_append_after_a_torn_tail_keeps_the_new_record(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"b": 2, "c"')  # a writer killed mid-line
    append_jsonl(path, {"d": 4})
    append_jsonl(path, {"e": 5})
    read = read_jsonl(path)
    assert read.rows == [{"a": 1}, {"d": 4}, {"e": 5}]
    assert read.torn == [2]
    assert path.read_text().endswith('{"e": 5}\n')


def test_append_to_a_clean_or_new_file_adds_no_blank_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "m.jsonl"
    append_jsonl(path, {"a": 1})
    append_jsonl(path, {"b": 2})
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_line_appender_opens_its_file_once_and_fsyncs_every_line(tmp_path: Path, monkeypatch) -> None:
    """A journal's appends: one open for all its lines (not an open, stat and close per episode), each line
    fsynced before `append` returns."""
    path = tmp_path / "rank_0.jsonl"
    calls: list[str] = []
    real_open, real_fsync = os.open, os.fsync
    monkeypatch.setattr(os, "open", lambda *a, **k: calls.append("open") or real_open(*a, **k))
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    appender = LineAppender(path)
    for i in range(5):
        appender.append(json.dumps({"i": i}))
        assert read_jsonl(path).rows[-1] == {"i": i}  # on disk before the next line
    appender.close()
    assert calls == ["open"] + ["fsync"] * 5
    assert path.read_text() == "".join(f'{{"i": {i}}}\n' for i in range(5))


def test_a_line_appender_after_a_torn_write_opens_again_and_starts_a_line_of_its_own(
    tmp_path: Path, monkeypatch
) -> None:
    """A write cut short (a full disk) leaves part of a line: the next line still parses, the torn one is
    skipped, and the error reached the caller."""
    path = tmp_path / "rank_0.jsonl"
    appender = LineAppender(path)
    appender.append('{"a": 1}')
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[: len(data) // 2]))
    with pytest.raises(OSError, match="wrote 5 of 10 bytes"):
        appender.append('{"bb": 2}')
    monkeypatch.setattr(os, "write", real_write)
    appender.append('{"c": 3}')
    read = read_jsonl(path)
    assert read.rows == [{"a": 1}, {"c": 3}] and read.torn == [2]


def test_valid_lines_round_trip(tmp_path: Path) -> None:
    rows = [{"a": 1}, [1, 2], "text", None, 3.5, {"nested": {"ü": "ß"}}]
    path = tmp_path / "m.jsonl"
    save_jsonl(path, rows)
    read = read_jsonl(path)
    assert read.rows == rows and read.torn == []
    assert read.numbers == list(range(1, len(rows) + 1))
    assert path.read_text(encoding="utf-8") == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def test_a_shared_append_waits_for_the_lock_another_process_holds(tmp_path: Path) -> None:
    # metrics.jsonl's appends hold <path>.lock: a rollout run and an update run (maybe on two NFS clients) share it
    path = tmp_path / "metrics.jsonl"
    append = "import sys; from rollout_engine.files import append_shared_jsonl; append_shared_jsonl(sys.argv[1], {})"
    with shared_lock(f"{path}.lock"):
        child = subprocess.Popen([sys.executable, "-c", append, str(path)], cwd=ROOT)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.5)  # blocked on the lock this process holds
        assert not path.exists()
    assert child.wait(timeout=30) == 0
    assert read_jsonl(path).rows == [{}]
    assert stat.S_IMODE(os.stat(f"{path}.lock").st_mode) == 0o644  # the log path is shared with other users


def test_a_non_durable_save_is_atomic_and_never_fsyncs(tmp_path: Path, monkeypatch) -> None:
    from rollout_engine.files import save_text

    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    save_text(tmp_path / "durable", "a\n")
    assert len(calls) == 2  # the file, then its directory
    save_text(tmp_path / "beat", "1 2.0 h 3\n", durable=False)
    save_text(tmp_path / "beat", "2 3.0 h 3\n", durable=False)
    assert len(calls) == 2 and (tmp_path / "beat").read_text() == "2 3.0 h 3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beat", "durable"]  # no temp file left


def test_an_overwrite_creates_the_file_once_then_rewrites_it_in_place_without_rename_or_fsync(
    tmp_path: Path, monkeypatch
) -> None:
    """A heartbeat, a status file or a process record on every node: one create the first time (no temp file and
    rename), then no create, no rename (a metadata server's costly operations), no fsync; a shorter content leaves
    no tail of the longer one."""
    from rollout_engine.files import overwrite_text

    path = tmp_path / "beats" / "rank_1"
    seen: list = []
    real_open, real_replace = os.open, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: seen.append("fsync"))
    monkeypatch.setattr(os, "replace", lambda *a, **k: seen.append("replace") or real_replace(*a, **k))
    monkeypatch.setattr(os, "rename", lambda *a, **k: seen.append("rename"))
    monkeypatch.setattr(os, "open", lambda p, flags, *a: seen.append(flags & os.O_CREAT) or real_open(p, flags, *a))
    overwrite_text(path, "1 2.000 host 3 stop\n")  # the first: one create by name, no temp file or rename
    assert path.read_text() == "1 2.000 host 3 stop\n" and path.stat().st_mode & 0o777 == 0o644
    # no file: an open, a create that finds no folder, the folder made, the create
    assert seen == [0, os.O_CREAT, os.O_CREAT] and sorted(p.name for p in path.parent.iterdir()) == ["rank_1"]
    inode = path.stat().st_ino
    seen.clear()
    overwrite_text(path, "2 3.000 host 3\n")
    assert path.read_text() == "2 3.000 host 3\n" and path.stat().st_ino == inode
    assert seen == [0]  # one open, without O_CREAT: nothing else went to the server but the write and the cut
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank_1"]


def test_read_fresh_looks_past_a_cached_absence_the_listing_contradicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that cached a name's absence (its first read fails) is asked again once a listing shows it; a
    file no way shows is absent."""
    path = tmp_path / "rank_1.json"
    path.write_text("{}")
    real = Path.read_bytes
    misses = iter([True])  # the first read meets the cached absence

    def cached(self: Path) -> bytes:
        if self == path and next(misses, False):
            raise FileNotFoundError(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", cached)
    assert read_fresh(path) == b"{}"
    with pytest.raises(FileNotFoundError):
        read_fresh(tmp_path / "rank_2.json")


def test_read_fresh_opens_again_a_file_another_node_replaced_under_a_stale_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file another client replaced by rename can answer ESTALE through the handle this client cached
    (GlusterFS: a heartbeat read while its writer renamed the next one over it): looked up again, it reads."""
    import errno

    path = tmp_path / "rank_2"
    path.write_text("beat 7\n")
    real = Path.read_bytes
    stale = iter([True, True])

    def replaced(self: Path) -> bytes:
        if self == path and next(stale, False):
            raise OSError(errno.ESTALE, "Stale file handle", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", replaced)
    assert read_fresh(path) == b"beat 7\n"


def test_make_dirs_tries_again_while_a_folder_another_client_makes_answers_enoent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GlusterFS, two nodes starting at once (seen in test_multinode): mkdir of <log>/run/rank_0 answered ENOENT
    although <log>/run answered EEXIST. The folders on the way are listed and the mkdir tried again; a
    folder that never shows stays an error."""
    target = tmp_path / "exp" / "run" / "rank_0"
    real, listed = Path.mkdir, []
    misses = iter([True, True])  # the first two tries meet the folder being made

    def racing(self: Path, *args, **kwargs) -> None:
        if self == target and next(misses, False):
            raise FileNotFoundError(self)
        real(self, *args, **kwargs)

    real_listdir = os.listdir
    monkeypatch.setattr(Path, "mkdir", racing)
    monkeypatch.setattr(os, "listdir", lambda folder: listed.append(Path(folder)) or real_listdir(folder))
    make_dirs(target)
    assert target.is_dir() and listed[:2] == [target.parent, target.parent.parent]

    misses, target = iter([True] * STALE_TRIES), tmp_path / "exp" / "run" / "rank_1"
    with pytest.raises(FileNotFoundError):
        make_dirs(target)


def test_make_dirs_tries_again_when_a_folder_another_client_made_answers_eexist_but_is_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GlusterFS, 8 nodes starting at once (bench/fs_real.py): Path.mkdir(exist_ok=True) of <log>/roles/rollout
    raised FileExistsError, for the folder another node had just made answered EEXIST while this client's cached
    absence still said it was no folder. The folders on the way are listed and the mkdir tried again."""
    target = tmp_path / "exp" / "roles" / "rollout"
    real = Path.mkdir
    misses = iter([True])

    def racing(self: Path, *args, **kwargs) -> None:
        if self == target and next(misses, False):
            raise FileExistsError(17, "File exists", str(self))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing)
    make_dirs(target)
    assert target.is_dir()


def test_read_sealed_reads_again_while_a_client_shows_a_shorter_prefix_of_a_sealed_journal(tmp_path: Path) -> None:
    """sshfs keeps a file's size for 20 s and reads only up to it: the master read another node's journal a
    few seconds after it was sealed and found it changed (a soak on sshfs). The reader waits for all of it."""
    import hashlib

    from rollout_engine.shared_read import read_sealed

    journal = tmp_path / "rank_1.jsonl"
    journal.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    full = journal.read_bytes()
    shown = [full[:9], full[:9], full]  # what this client shows at each read: its old size twice, then all
    slept: list[float] = []
    data = read_sealed(journal, len(full), hashlib.sha256(full).hexdigest(), 5, lambda p: shown.pop(0), slept.append)
    assert data == full and slept == [0.5, 0.5]
    # a journal changed after its seal (shorter than sealed for longer than the wait) is returned as it is
    journal.write_bytes(full[:9])
    assert read_sealed(journal, len(full), hashlib.sha256(full).hexdigest(), 0) == full[:9]
