"""The e2e tests' bounded waits: a bound derived from the work, and a timeout that says what it waited for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.rollout_cli import rollout_work
from tests.waits import SLOWEST_TOKENS_PER_S, START_S, communicate_waiting, generation_s, run_waiting, wait_until


def test_bound_grows_with_the_tokens_to_generate() -> None:
    assert generation_s(192, 24) == START_S + 192 * 24 / SLOWEST_TOKENS_PER_S
    assert generation_s(6, 24, turns=4) == generation_s(24, 24)


def test_rollout_work_reads_the_command_and_the_config_defaults() -> None:
    cmd = ["py", "-m", "rollout_engine", "--config-name", "rollout_train", "data_path=/d"]
    assert rollout_work([*cmd, "env_config.train_tasks_rollout_size=48", "policy_config.max_new_tokens=24"]) == (
        192,
        24,
    )
    test = ["py", "-m", "rollout_engine", "--config-name", "rollout_test", "env_config.n_samples_per_task=2"]
    assert rollout_work(test) == (160, 256)  # every one of the 80 default test tasks, twice


def test_run_waiting_names_what_it_waited_for() -> None:
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 1 s waiting for a nap; last output:\nstarted"):
        run_waiting(cmd, waiting_for="a nap", timeout=1)


def test_communicate_waiting_stops_the_process_and_names_what_it_waited_for() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    with pytest.raises(pytest.fail.Exception, match="timed out after 1 s waiting for a long sleep"):
        communicate_waiting(proc, waiting_for="a long sleep", timeout=1)
    assert proc.poll() is not None


def test_wait_until_polls_until_true_and_names_what_it_waited_for() -> None:
    seen = []
    wait_until(lambda: seen.append(1) or len(seen) == 3, waiting_for="three polls", timeout=10, every=0.01)
    assert len(seen) == 3
    with pytest.raises(pytest.fail.Exception, match="timed out after 0 s waiting for the impossible"):
        wait_until(lambda: False, waiting_for="the impossible", timeout=0.05, every=0.01)

    def ended() -> None:
        pytest.fail("the job ended")

    with pytest.raises(pytest.fail.Exception, match="the job ended"):
        wait_until(lambda: False, waiting_for="never", timeout=10, check=ended)
