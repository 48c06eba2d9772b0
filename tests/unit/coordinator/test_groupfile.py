"""coordinator/groupfile.py: a rank's process-group records, read as the driver rewrites them in place."""

from __future__ import annotations

from pathlib import Path

from coordinator.groupfile import Record, encode, parse, read


def test_records_read_back_as_written_one_line_a_group() -> None:
    records = {"vllm": Record(4321, "98765"), "heartbeat": Record(77, "")}
    data = encode(records)
    assert parse(data) == records
    assert data.decode().splitlines()[1:3] == [
        ' "heartbeat": {"pgid": 77, "start": ""},',
        ' "vllm": {"pgid": 4321, "start": "98765"}',
    ]


def test_what_a_group_holds_is_kept_on_its_line_and_left_out_when_nothing() -> None:
    records = {"vllm": Record(20, "2", holds="/log/policy/v0003"), "heartbeat": Record(77, "5")}
    data = encode(records)
    assert parse(data) == records
    assert ' "vllm": {"pgid": 20, "start": "2", "holds": "/log/policy/v0003"}' in data.decode().splitlines()
    assert ' "heartbeat": {"pgid": 77, "start": "5"},' in data.decode().splitlines()


def test_a_rewrite_that_shortened_the_file_reads_as_the_new_records_before_its_cut() -> None:
    old = encode({"rollout-train": Record(10, "1"), "vllm": Record(20, "2")})
    new = encode({"vllm": Record(20, "2")})
    assert len(new) < len(old)
    assert parse(new + old[len(new) :]) == {"vllm": Record(20, "2")}  # the new bytes, then the old tail


def test_an_empty_file_holds_no_records_and_other_bytes_are_no_records_file(tmp_path: Path) -> None:
    assert parse(b"") == {} and parse(b"\n") == {}
    assert parse(b"4321 98765\n") is None  # a record of the one-file-a-group format
    assert parse(b'["vllm"]') is None
    assert parse(b'{"vllm": {"pgid": "x"}, "ok": {"pgid": 3}}') == {"ok": Record(3, "")}
    assert read(tmp_path / "missing.json") == {}
    (tmp_path / "groups.json").write_bytes(b"{not json")
    assert read(tmp_path / "groups.json") == {}
