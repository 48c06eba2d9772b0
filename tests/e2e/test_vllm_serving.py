"""The real vLLM serves the default model through the product's driver (coordinator/driver/vllm.py:
PolicyServer) and answers the official openai client; a server of another run is never reused. (That a
stopped server leaves no process behind: tests/e2e/test_update_paths.py's fresh server.)"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI

from coordinator.driver import say
from coordinator.driver.procs import group_members, start_time
from rollout_engine.layout import GROUPS_NAME
from tests.conftest import REPO
from tests.e2e.conftest import policy_server

pytestmark = pytest.mark.e2e


def test_the_openai_client_gets_a_chat_completion(vllm_server) -> None:
    """(A server's process tree, its reuse by a second start on its port and its clean stop: the fresh server of
    tests/e2e/test_update_paths.py, test_a_reloaded_policy_serves_what_a_fresh_server_serves.)"""
    client = OpenAI(base_url=vllm_server.base_url, api_key="unused")
    reply = client.chat.completions.create(
        model=vllm_server.model,
        messages=[{"role": "user", "content": "What is 2+3? Answer with only the final number."}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].message.content.strip()
    assert reply.usage.completion_tokens > 0
    # on a CPU with the uni executor the engine core is forked from the server (coordinator/vllm_serve.py): a
    # spawned one would have imported vLLM again, and brought multiprocessing's resource tracker into the group
    if vllm_server.server.settings.engine_fork:
        assert _group_commands(vllm_server.pgid()) == [
            f"{vllm_server.server.serve_py} {REPO / 'coordinator' / 'vllm_serve.py'}",
            "VLLM::EngineCore",
        ]


def _group_commands(pgid: int) -> list[str]:
    """The command lines (the first two words) of process group `pgid`'s live processes, oldest first."""
    commands = []
    for pid in sorted(group_members(pgid), key=lambda pid: int(start_time(pid) or 0)):
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        commands.append(" ".join(w.decode() for w in words[:2] if w))
    return commands


def test_a_server_this_run_did_not_start_is_never_reused(vllm_server, tmp_path: Path) -> None:
    # same model, same served name: still another run's server, whose weights a reload would replace
    with pytest.raises(say.Die) as refused:
        policy_server(tmp_path, vllm_server.port, vllm_server.model).start(str(vllm_server.model_path), deadline_s=30)
    assert refused.value.code == 1
    assert f"port {vllm_server.port} is held by a server that this run did not start" in refused.value.message
    assert not (tmp_path / GROUPS_NAME).exists(), "nothing may be started when the port is taken"


def _sleeping(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=30) as answer:
        return json.load(answer)["is_sleeping"]


def test_the_update_sequence_of_a_gpu_node_is_accepted(vllm_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the loop sends around an update on a GPU node, in its order: `PolicyServer.sleep` before training,
    `wake` after, then `reload` of the promoted weights (here the same weights) and its prefix-cache reset.
    BATON_DEVICE=cuda makes vllm.py send sleep and wake (on CPU it skips them). vLLM's CPU worker accepts both
    without freeing anything ("sleep mode is not supported on CPU, ignore it"), but the server still keeps and
    reports the state, so this proves the requests and their order, not the memory they free on a GPU."""
    server, port = vllm_server.server, vllm_server.port
    before = server.fingerprint()
    assert before, "no fingerprint from the server (see stderr)"
    with monkeypatch.context() as gpu:
        gpu.setenv("BATON_DEVICE", "cuda")
        try:
            assert server.sleep()
            assert _sleeping(port)
        finally:
            awake = server.wake()
    assert awake
    assert not _sleeping(port)
    assert server.reload(str(vllm_server.model_path))
    assert server.fingerprint() == before
