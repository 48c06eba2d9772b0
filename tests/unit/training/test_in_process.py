"""training/update.py in the warm trainer (training/warm.py): rank 0 alone runs a lead step (prepare, promote) and
its outcome reaches the other ranks, so all of them train or all stop with the same exit."""

from __future__ import annotations

import pytest

from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from training import update
from training.update import NothingToTrain, TrainingError, _on_lead, in_process


def no_training(*_args):
    raise AssertionError("no training in these tests")


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (None, 0),
        (NothingToTrain("few"), Exit.NOTHING_TO_TRAIN),
        (ConfigError("bad"), Exit.BAD_INPUT),
        (OSError("disk"), Exit.FAILED),
    ],
)
def test_rank_0_runs_the_step_and_shares_its_outcome(raised: Exception | None, code: int) -> None:
    ran, shared = [], []

    def step() -> None:
        ran.append(True)
        if raised is not None:
            raise raised

    with in_process(0, 2, no_training, lambda c: shared.append(c) or c):
        if raised is None:
            _on_lead(step)
        else:
            with pytest.raises(type(raised)):
                _on_lead(step)
    assert ran == [True] and shared == [code]


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (Exit.NOTHING_TO_TRAIN, NothingToTrain),
        (Exit.BAD_INPUT, ConfigError),
        (Exit.FAILED, TrainingError),
        (7, TrainingError),
    ],
)
def test_another_rank_skips_the_step_and_stops_as_rank_0_did(code: int, error: type[Exception]) -> None:
    with in_process(1, 2, no_training, lambda _c: code), pytest.raises(error, match="rank 0 stopped this update"):
        _on_lead(no_training)


def test_another_rank_goes_on_when_rank_0_succeeded_and_one_rank_or_none_runs_the_step_itself() -> None:
    with in_process(1, 2, no_training, lambda _c: 0):
        _on_lead(no_training)
    ran = []
    with in_process(0, 1, no_training, no_training):  # one rank: nothing to share
        _on_lead(lambda: ran.append(1))
    _on_lead(lambda: ran.append(2))  # python -m training
    assert ran == [1, 2] and update._in_process is None


class FakeCuda:
    """torch.cuda as a worker sees it: `allocated` bytes on each device once initialised."""

    def __init__(self, allocated: list[int], initialised: bool = True) -> None:
        self.allocated, self.initialised = allocated, initialised

    def is_available(self) -> bool:
        return bool(self.allocated)

    def is_initialized(self) -> bool:
        return self.initialised

    def device_count(self) -> int:
        return len(self.allocated)

    def memory_allocated(self, device: int) -> int:
        return self.allocated[device]

    def memory_reserved(self, device: int) -> int:
        return self.allocated[device] + (2 << 20)  # the caching allocator keeps a block beyond the tensors


@pytest.mark.parametrize(
    ("allocated", "initialised", "kept"),
    [([], False, 0), ([5 << 30], False, 0), ([0, 300 << 20], True, 300 << 20), ([10, 20], True, 20)],
)
def test_the_gpu_memory_a_worker_keeps_is_the_most_any_device_holds_once_cuda_started(
    allocated: list[int], initialised: bool, kept: int
) -> None:
    from types import SimpleNamespace

    from training.warm import KEEP_GPU_BYTES, gpu_memory_kept

    assert gpu_memory_kept(SimpleNamespace(cuda=FakeCuda(allocated, initialised))) == kept
    assert (kept > KEEP_GPU_BYTES) == (kept == 300 << 20)


@pytest.mark.parametrize(
    ("allocated", "initialised", "held"),
    [
        ([], False, {}),
        ([5 << 30], False, {}),
        ([0, 300 << 20], True, {"gpu_allocated_mib": 300.0, "gpu_reserved_mib": 302.0}),
    ],
)
def test_a_workers_report_of_a_job_says_the_gpu_memory_it_holds_after_it_once_cuda_started(
    allocated: list[int], initialised: bool, held: dict
) -> None:
    from types import SimpleNamespace

    from training.warm import gpu_memory_held

    assert gpu_memory_held(SimpleNamespace(cuda=FakeCuda(allocated, initialised))) == held


@pytest.mark.parametrize(
    ("argv", "everyone"),
    [
        ([], True),
        (["phase=all"], True),
        (["phase=train", "x=1"], True),
        (["phase=prepare"], False),
        (["phase=train", "phase=promote"], False),
        (["phase=check"], False),
    ],
)
def test_a_job_that_trains_runs_on_every_worker_any_other_on_rank_0_alone(
    argv: list[str], everyone: bool, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On several nodes the master hands prepare and promote to its own trainer only: a collective there would wait
    for workers that never get the job. So rank 0 runs them by itself, any layout, and the others answer at once."""
    from training import warm

    ran: list[tuple[int, bool]] = []
    monkeypatch.setattr(warm, "run_argv", lambda a, worker, seq, alone=False: ran.append((worker.rank, alone)) or 5)
    job = {"seq": 1, "argv": argv, "log": str(tmp_path / "update.log")}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        code, all_ran = warm.Worker(tmp_path).run_job(job)
        assert all_ran == everyone
        assert code == (5 if everyone or rank == 0 else 0)
    assert ran == ([(0, False), (1, False)] if everyone else [(0, True)])


def test_in_the_warm_trainer_a_lora_is_merged_by_its_export_function_with_no_process_started(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from training import update as update_mod

    paths = SimpleNamespace(
        run_dir=tmp_path, output=tmp_path / "output", merged=tmp_path / "merged", recipe=tmp_path / "train_config.yaml"
    )
    paths.recipe.write_text("template: smollm2\n")
    cfg = SimpleNamespace(launch=None)
    monkeypatch.setattr(update_mod.config_mod, "model_path", lambda _cfg: tmp_path / "model")
    monkeypatch.setattr(update_mod, "run_group", lambda *a, **k: pytest.fail("a process was started"))
    exported: list[tuple[str, str]] = []

    def export(recipe, log):
        exported.append((recipe.name, log.name))
        return 0

    with in_process(0, 1, no_training, no_training, export):
        assert update_mod.merge_lora(cfg, paths) == paths.merged
    assert exported == [("merge_config.yaml", "merge.log")]
    with in_process(0, 1, no_training, no_training, lambda *_a: 1), pytest.raises(TrainingError, match="exit 1"):
        update_mod.merge_lora(cfg, paths)


def test_the_job_a_trainer_works_on_is_read_from_its_folder_as_a_job_passes_through_it(tmp_path) -> None:
    """The readers of a trainer's folder (the dashboard's job_running, the soak's job_started) through one job's
    life: handed over (job_running says so; not started), started, done; a torn or missing file reads as nothing."""
    from rollout_engine.files import save_json
    from training.warm import JOB, STARTED, done_name, job_running, job_started

    assert (job_running(tmp_path), job_started(tmp_path)) == ("", None)
    save_json(tmp_path / done_name(0), {"seq": 3, "exit": 0})
    save_json(tmp_path / JOB, {"seq": 4, "argv": ["phase=train", "iteration=2"], "log": "x"})
    assert (job_running(tmp_path), job_started(tmp_path)) == ("update", None)
    save_json(tmp_path / STARTED, {"seq": 3, "timeout_s": 60})  # the last job's word
    assert job_started(tmp_path) is None
    save_json(tmp_path / STARTED, {"seq": 4, "timeout_s": 60})
    assert job_started(tmp_path) == ["phase=train", "iteration=2"]
    (tmp_path / done_name(0)).write_text('{"seq": ')  # torn: the job is not known to be done
    assert job_started(tmp_path) == ["phase=train", "iteration=2"] and job_running(tmp_path) == "update"
    save_json(tmp_path / done_name(0), {"seq": 4, "exit": 0})
    assert (job_running(tmp_path), job_started(tmp_path)) == ("", None)
    save_json(tmp_path / JOB, {"seq": 5, "argv": ["phase=check"], "log": "x"})
    assert job_running(tmp_path) == "update-check"
    (tmp_path / JOB).write_text("[]")
    assert (job_running(tmp_path), job_started(tmp_path)) == ("", None)
