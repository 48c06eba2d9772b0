"""rollout_engine.errors.disk_full: a full filesystem is one line naming the file and the fix."""

import errno
import os

from rollout_engine.errors import disk_full


def test_enospc_names_the_file_and_the_fix() -> None:
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/log/trajectories/train/iter_0001/rank_0.jsonl")
    line = disk_full(exc)
    assert line is not None
    assert "writing /log/trajectories/train/iter_0001/rank_0.jsonl" in line
    assert "No space left on device" in line and "--resume" in line


def test_a_quota_is_full_too_and_the_chain_is_searched() -> None:
    try:
        try:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        except OSError as inner:
            raise RuntimeError("while sealing") from inner
    except RuntimeError as outer:
        assert disk_full(outer) is not None


def test_other_errors_are_not_a_full_disk() -> None:
    assert disk_full(OSError(errno.EACCES, "Permission denied", "/x")) is None
    assert disk_full(ValueError("x")) is None
