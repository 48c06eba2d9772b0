"""Bad input to the real rollout CLI: exit code 2, a message naming the field, nothing written or overwritten."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.e2e.rollout_cli import rollout_cmd, run_rollout

pytestmark = pytest.mark.e2e


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    tasks = tmp_path / "data" / "tasks"
    tasks.mkdir(parents=True)
    row = {
        "task_id": "a",
        "task_name": "Calculate 1 + 1.",
        "metadata": {"dataset": "chain_sum", "entry": {"question": "Calculate 1 + 1.", "answer": "2", "metadata": {}}},
    }
    (tasks / "test.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path / "data"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env_config.server_size=0"], "env_config.server_size must be >= 1 (got 0)"),
        (["env_config.server_size=many"], "env_config.server_size"),
        (["env_config.no_such_key=1"], "no_such_key"),
        (["env=no_such_env"], "no_such_env"),
        (["env_config.test_tasks=tasks/missing.jsonl"], "env_config.test_tasks does not exist"),
        (["policy_config.max_retries=1", "policy_config.retry_backoff_s=0.1"], "policy_config.base_url is unreachable"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(data: Path, tmp_path: Path, overrides: list[str], message: str) -> None:
    log = tmp_path / "log"
    out = run_rollout(rollout_cmd("rollout_test", data, log, closed_port_url(), *overrides), timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr
    assert not log.exists()


def test_malformed_task_line_named_and_existing_journal_untouched(data: Path, tmp_path: Path) -> None:
    (data / "tasks" / "test.jsonl").write_text('{"task_id": "a", "task_name": "x"}\n{"task_id": \n')
    log = tmp_path / "log"
    journal = log / "trajectories" / "test" / "iter_0000" / "rank_0.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("earlier work\n")
    out = run_rollout(rollout_cmd("rollout_test", data, log, closed_port_url()), timeout=120)
    assert out.returncode == 2
    assert "test.jsonl:2 is not valid JSON" in out.stderr
    assert journal.read_text() == "earlier work\n"
    assert sorted(p.name for p in journal.parent.iterdir()) == ["rank_0.jsonl"]
