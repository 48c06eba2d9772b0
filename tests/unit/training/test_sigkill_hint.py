"""training/update.py names the OOM killer when a training died of a SIGKILL nobody of ours sent."""

from pathlib import Path

from training.update import killed_by_sigkill

#: torchrun's report when the kernel killed a worker (torch.distributed.elastic, as LLaMA-Factory's log has it)
TORCHRUN_KILLED = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/llamafactory/launcher.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 4321)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4321
============================================================
"""

TORCHRUN_FAILED = TORCHRUN_KILLED.replace("exitcode  : -9", "exitcode  : 1").replace(
    "traceback : Signal 9 (SIGKILL) received by PID 4321", "traceback : To enable traceback see: ..."
)


def test_a_worker_killed_by_sigkill_is_named(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.3\n" * 100 + TORCHRUN_KILLED)
    assert killed_by_sigkill(1, log)


def test_the_launcher_itself_killed(tmp_path: Path) -> None:
    assert killed_by_sigkill(-9, tmp_path / "absent.log")
    assert killed_by_sigkill(137, tmp_path / "absent.log")


def test_an_ordinary_failure_is_not_a_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(TORCHRUN_FAILED + "exitcode  : -90 (pid: 1)\n")
    assert not killed_by_sigkill(1, log)
    assert not killed_by_sigkill(1, tmp_path / "absent.log")
