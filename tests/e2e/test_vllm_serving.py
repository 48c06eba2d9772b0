"""The real vLLM serves the default model through the product's driver (coordinator/driver/vllm.py:
PolicyServer), answers the official openai client, and leaves no process behind when stopped."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI

from coordinator.driver import say
from tests.e2e.conftest import policy_server, start_vllm, stop_vllm

pytestmark = pytest.mark.e2e


def _descendants(root: int) -> set[int]:
    """Every live process whose parent chain reaches `root` (plus root)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return {pid for pid in found if Path(f"/proc/{pid}").exists()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


def test_chat_completion_then_clean_stop(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_vllm(tmp_path, model_dir)
    try:
        pgid = server.pgid()
        started = _descendants(pgid)
        assert len(started) >= 2, "vLLM runs an API server and an engine process"
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "What is 2+3? Answer with only the final number."}],
            max_tokens=16,
            temperature=0,
        )
        assert reply.choices[0].message.content.strip()
        assert reply.usage.completion_tokens > 0
        # a second start on the same port (a later run on this run directory) reuses the healthy server
        # instead of racing it
        capsys.readouterr()
        policy_server(tmp_path, server.port, server.model).start(str(model_dir), deadline_s=60)
        assert "reusing it" in capsys.readouterr().err
        assert server.pgid() == pgid, "the recorded server was restarted instead of reused"
    finally:
        stop_vllm(server)
    left = [pid for pid in started if _alive(pid)]
    assert left == [], f"processes left after PolicyServer.stop: {left}"
    assert not (tmp_path / "pids" / "vllm.pgid").exists()


def test_a_server_this_run_did_not_start_is_never_reused(vllm_server, tmp_path: Path) -> None:
    # same model, same served name: still another run's server, whose weights a reload would replace
    with pytest.raises(say.Die) as refused:
        policy_server(tmp_path, vllm_server.port, vllm_server.model).start(str(vllm_server.model_path), deadline_s=30)
    assert refused.value.code == 1
    assert f"port {vllm_server.port} is held by a server that this run did not start" in refused.value.message
    assert not (tmp_path / "pids").exists(), "nothing may be started when the port is taken"


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
