"""coordinator/driver/vllm.py: a recorded vLLM is reused only when it is the server answering on the
expected port with the expected served name; a start tries 3 times and says why each failed (an argument
vLLM's parser refuses is bad input at once); a new policy is served by an in-place reload when the outputs
show it, else by a restart. Its arguments are vllm_config's resolved for the node (test_vllm_settings.py).

tests/shell/fake_vllm.py stands in for vLLM (health, model list, a fingerprint completion, the reload
and sleep endpoints) on a free loopback port; as the serve interpreter, a script runs it with vLLM's
own command line. A fake nvidia-smi on PATH stands in for GPUs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coordinator import groupfile
from coordinator.driver import say, vllm
from coordinator.driver.procs import Groups, group_alive
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import Machine, device, for_node, gpu_count, resolve
from rollout_engine.config import VllmConfig
from rollout_engine.layout import GROUPS_NAME
from tests.unit.driver.fakes import FAKE_VLLM, SETTINGS, SHAPE


@pytest.fixture(autouse=True)
def settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without the settings vllm.py reads, on a CPU."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATON_DEVICE", "cpu")


@pytest.fixture
def model(tmp_path: Path) -> str:
    return str(model_folder(tmp_path / "models" / "m"))


def model_folder(folder: Path, tied: bool = False, tensors: tuple[str, ...] = ()) -> Path:
    """A model folder: a config.json of SHAPE (tying the head to the embeddings when `tied`) and, with
    `tensors`, a model.safetensors holding them (headers only, one float each)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**SHAPE, "tie_word_embeddings": tied}))
    if tensors:
        header = {
            name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(tensors)
        }
        blob = json.dumps(header).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4 * len(tensors)))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    """Something answers /health on the port (independent of the code under test)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
            return True
    except OSError:
        return False


def wait_healthy(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(port):
        if time.monotonic() > deadline:
            pytest.fail(f"no server answered on port {port} within {timeout}s")
        time.sleep(0.05)


def fake_cmd(port: int, name: str, model: str, *flags: str) -> list[str]:
    return [sys.executable, str(FAKE_VLLM), "--port", str(port), "--served-model-name", name, "--model", model, *flags]


def serve(groups: Groups, port: int, name: str, model: str, *flags: str) -> int:
    """Start the fake server as this run's recorded vLLM; its group id."""
    job = groups.start("vllm", fake_cmd(port, name, model, *flags), groups.run_dir / "vllm.log")
    wait_healthy(port)
    return job.pgid


def script(path: Path, body: str) -> str:
    """An executable shell script at `path` running `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_serve_py(tmp_path: Path, *flags: str) -> str:
    """A serve interpreter that runs the fake server with vLLM's command line (and `flags`)."""
    return script(tmp_path / "bin" / "serve-python", f'exec {sys.executable} {FAKE_VLLM} {" ".join(flags)} "$@"')


def policy_server(run_dir: Path, port: int, groups: Groups, serve_py: str = "false", **kw) -> PolicyServer:
    return PolicyServer(run_dir, port, "policy", groups, Supervisor(poll_s=0.05), serve_py, poll_s=0.05, **kw)


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listing: str, caps: str = "") -> None:
    """nvidia-smi on PATH: `-L` runs `listing`; the compute-capability query prints `caps`."""
    script(tmp_path / "fakebin" / "nvidia-smi", f'case "$1" in -L) {listing} ;; *) printf "{caps}" ;; esac')
    monkeypatch.setenv("PATH", f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("BATON_DEVICE")


def gpus(n: int) -> str:
    return "; ".join(f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"' for i in range(n))


# --- device and GPUs (envs.sh) -------------------------------------------------------------------


def test_device_is_cpu_without_nvidia_smi_or_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    assert device({"PATH": str(tmp_path / "empty")}) == "cpu"
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "No devices were found"; exit 6')
    assert device() == "cpu" and gpu_count() == 0


def test_device_is_cuda_when_nvidia_smi_lists_gpus_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, gpus(2))
    assert device() == "cuda" and gpu_count() == 2


def test_gpu_count_is_narrowed_by_cuda_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, gpus(8))
    env = dict(os.environ)
    assert gpu_count({**env, "CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert gpu_count({**env, "CUDA_VISIBLE_DEVICES": "GPU-3"}) == 1
    assert gpu_count({**env, "CUDA_VISIBLE_DEVICES": ""}) == 0
    assert gpu_count({**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7,8,9"}) == 8  # only the listed ones exist
    assert gpu_count(env) == 8


def test_baton_device_overrides_detection_and_a_bad_value_is_exit_2() -> None:
    assert device({"BATON_DEVICE": "cuda", "PATH": ""}) == "cuda"
    assert gpu_count({"BATON_DEVICE": "cpu"}) == 0
    with pytest.raises(say.Die) as bad:
        device({"BATON_DEVICE": "tpu"})
    assert (bad.value.code, bad.value.message) == (
        2,
        "BATON_DEVICE must be cpu or cuda (got 'tpu'); unset it to auto-detect",
    )


# --- choose, args, command ------------------------------------------------------------------------


def test_choose_on_a_cpu_says_and_records_the_dtype_and_kv_cache(
    run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without settings from run.sh (bench/, the e2e fixtures), vllm_config's defaults are resolved for this
    machine: one worker, a 2048-token context on a CPU, no media path; one NUMA node here, so the worker runs in
    vLLM's engine process (the uni executor), which coordinator/vllm_serve.py forks from the server."""
    monkeypatch.setenv("BATON_VLLM_DTYPE", "float32")
    monkeypatch.setenv("CPU_VISIBLE_MEMORY_NODES", "0")
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_SIM_MULTI_NUMA", "BATON_VLLM_ENGINE_FORK"):
        monkeypatch.delenv(name, raising=False)
    server = policy_server(run_dir, 8999, groups, serve_py="/serve/python")

    assert server.choose(model) == ("float32", 4)

    assert capsys.readouterr().err == (
        "[baton] serving float32: forced by BATON_VLLM_DTYPE; KV cache 4 GiB for 32 requests of 2048 tokens\n"
    )
    record = json.loads((run_dir / "serving.json").read_text())
    assert (record["device"], record["dtype"], record["kv_cache_gib"], record["forced"]) == ("cpu", "float32", 4, True)
    args = server.args(model)
    assert args == [
        *("--model", model, "--served-model-name", "policy"),
        *("--host", "127.0.0.1", "--port", "8999", "--dtype", "float32", "--generation-config", "vllm"),
        *("--enforce-eager", "--max-model-len", "2048", "--tensor-parallel-size", "1", "--data-parallel-size", "1"),
        *("--distributed-executor-backend", "uni"),
    ]
    assert server.command(model) == [
        "env",
        "VLLM_SERVER_DEV_MODE=1",
        "VLLM_CPU_KVCACHE_SPACE=4",
        "VLLM_ENABLE_V1_MULTIPROCESSING=0",
        "/serve/python",
        str(Path(__file__).resolve().parents[3] / "coordinator" / "vllm_serve.py"),
        *args,
    ]


def test_the_forking_server_runs_the_module_the_driver_runs_otherwise() -> None:
    from coordinator import vllm_serve

    assert vllm_serve.SERVER == vllm.SERVER_MODULE
    assert Path(vllm_serve.__file__).resolve() == vllm.FORKING_SERVER


def test_choose_takes_the_length_from_the_settings_and_the_kv_cache_from_the_environment(
    run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BATON_VLLM_DTYPE", "bfloat16")
    cpu = Machine("cpu", 0, numa_nodes=2)
    settings = resolve(VllmConfig(max_model_len=4096, extra_args=["--max-num-seqs", "8"]), cpu, SHAPE, "/exp")
    server = policy_server(run_dir, 8999, groups, max_sessions=8, settings=settings)
    assert server.choose(model, record=False) == ("bfloat16", 1)
    assert "KV cache 1 GiB for 8 requests of 4096 tokens" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")

    assert server.choose(model, record=False) == ("bfloat16", 7)

    assert "KV cache 7 GiB for 8 requests of 4096 tokens" in capsys.readouterr().err
    assert not (run_dir / "serving.json").exists()
    assert server.args(model)[-10:] == [
        *("--max-model-len", "4096", "--tensor-parallel-size", "1", "--data-parallel-size", "1"),
        *("--allowed-local-media-path", "/exp", "--max-num-seqs", "8"),
    ]
    # two tensor-parallel workers: VLLM_CPU_KVCACHE_SPACE is each one's, sized for its share of the KV heads
    # (2 of the 3: 64 x 4096 tokens x 15360 B x 1.15 = 4.6 GiB, where one worker needs 6.5: 7)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    server.max_sessions = 64
    assert server.choose(model, record=False) == ("bfloat16", 7)
    server.settings = resolve(VllmConfig(tensor_parallel_size=2, max_model_len=4096), cpu, SHAPE, "/exp")
    assert server.choose(model, record=False) == ("bfloat16", 5)
    assert "KV cache 5 GiB each of 2 workers for 64 requests of 4096 tokens" in capsys.readouterr().err


def test_choose_and_args_on_a_gpu_node(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, gpus(2), caps="8.0\\n8.0\\n")
    settings = for_node(VllmConfig(gpu_memory_utilization=0.5), Path(model), "/exp")
    server = policy_server(run_dir, 8999, groups, settings=settings)

    assert server.choose(model)[0] == "bfloat16"

    assert capsys.readouterr().err == "[baton] serving bfloat16: GPU compute capability 8.0 has bf16\n"
    assert server.args(model)[-11:] == [
        *("--enable-sleep-mode", "--max-model-len", "2048", "--tensor-parallel-size", "1"),
        *("--data-parallel-size", "2", "--gpu-memory-utilization", "0.5", "--allowed-local-media-path", "/exp"),
    ]


def test_choose_on_a_gpu_node_whose_job_may_use_none_of_its_gpus_is_exit_2(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, gpus(1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(say.Die) as none:
        policy_server(run_dir, 8999, groups).choose(model)
    assert none.value.code == 2
    assert none.value.message == (
        "no GPU to serve on: nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES names none; give the job a GPU, or "
        "set BATON_DEVICE=cpu"
    )


# --- reuse ------------------------------------------------------------------------------------------


def test_reuse_keeps_the_recorded_server_that_answers_on_its_port_with_the_served_name(
    run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    pgid = serve(groups, port, "policy", model)
    server = policy_server(run_dir, port, groups)

    assert server.reuse()
    assert capsys.readouterr().err == (
        f"[baton] vLLM on port {port} (group {pgid}, started by this run) already serves policy; reusing it\n"
    )
    assert server.reuse(model)
    assert f"already serves policy from {model}; reusing it" in capsys.readouterr().err
    assert group_alive(pgid) and groups.recorded("vllm") is not None


def test_reuse_stops_a_recorded_server_that_serves_another_name(
    run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    pgid = serve(groups, port, "other", model)

    assert not policy_server(run_dir, port, groups).reuse()

    assert capsys.readouterr().err == (
        f"[baton] warning: the vLLM this run started (group {pgid}) does not serve policy on port {port}; "
        "restarting it\n"
    )
    assert not group_alive(pgid) and groups.recorded("vllm") is None


def test_reuse_stops_a_recorded_server_of_other_weights(run_dir: Path, groups: Groups, model: str, capsys) -> None:
    port = free_port()
    pgid = serve(groups, port, "policy", model)

    assert not policy_server(run_dir, port, groups).reuse("/elsewhere/v0001")

    assert "does not serve policy from /elsewhere/v0001 on port" in capsys.readouterr().err
    assert not group_alive(pgid)


def test_reuse_stops_a_recorded_server_on_another_port_even_when_the_port_answers_with_the_name(
    run_dir: Path, groups: Groups, model: str, outsiders, capsys: pytest.CaptureFixture[str]
) -> None:
    pgid = serve(groups, free_port(), "policy", model)
    port = free_port()
    outsider = outsiders(*fake_cmd(port, "policy", model))
    wait_healthy(port)

    assert not policy_server(run_dir, port, groups).reuse()

    assert f"(group {pgid}) does not serve policy on port {port}; restarting it" in capsys.readouterr().err
    assert not group_alive(pgid)
    assert outsider.poll() is None


def test_start_never_takes_a_server_it_did_not_start_for_the_recorded_one(
    run_dir: Path, groups: Groups, model: str, outsiders, capsys: pytest.CaptureFixture[str]
) -> None:
    pgid = serve(groups, free_port(), "policy", model)
    port = free_port()
    outsider = outsiders(*fake_cmd(port, "policy", model))
    wait_healthy(port)

    with pytest.raises(say.Die) as held:
        policy_server(run_dir, port, groups).start(model, 5)

    assert held.value.code == 1
    assert held.value.message == (
        f"port {port} is held by a server that this run did not start; stop it or choose another port "
        "(BATON_VLLM_PORT), or use it with --debug-mode"
    )
    assert "reusing it" not in capsys.readouterr().err
    assert not group_alive(pgid)
    assert outsider.poll() is None


def test_reuse_forgets_a_record_whose_pid_now_names_another_process(run_dir: Path, groups: Groups, outsiders) -> None:
    other = outsiders("sleep", "300", new_session=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / GROUPS_NAME).write_bytes(groupfile.encode({"vllm": groupfile.Record(other.pid, "1")}))

    assert not policy_server(run_dir, free_port(), groups).reuse()

    assert other.poll() is None
    assert groupfile.read(run_dir / GROUPS_NAME) == {}


# --- start ------------------------------------------------------------------------------------------


def test_start_serves_and_records_the_weights_then_a_new_run_reuses_it(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("BATON_VLLM_DTYPE", "float32")
    port = free_port()
    server = policy_server(run_dir, port, groups, fake_serve_py(tmp_path))

    server.start(model)

    err = capsys.readouterr().err
    log = run_dir / "logs" / "vllm.log"
    assert f"[baton] starting vLLM (policy from {model}, port {port}, attempt 1/3, log: {log})\n" in err
    assert err.endswith(f"[baton] vLLM ready on port {port}\n")
    assert server.serves(model) and groups.listens("vllm", port)
    # the weights it holds ride on its group's record: no name of their own on the shared path
    assert server.recorded_weights() == model and groups.records()["vllm"].holds == model
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([GROUPS_NAME, "logs", "serving.json"])
    pgid = groups.recorded("vllm")[0]
    environ = Path(f"/proc/{pgid}/environ").read_bytes().split(b"\0")
    assert b"VLLM_SERVER_DEV_MODE=1" in environ and b"VLLM_CPU_KVCACHE_SPACE=4" in environ

    again = policy_server(run_dir, port, Groups(run_dir), fake_serve_py(tmp_path))
    again.start(model)

    assert "already serves policy from" in capsys.readouterr().err
    assert groups.recorded("vllm")[0] == pgid


def test_start_a_server_that_exits_during_its_start_up_is_said_to_have_exited_3_times_then_exit_1(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_py = script(tmp_path / "bin" / "boom", 'echo "boom: cannot load the model"; exit 1')
    server = policy_server(run_dir, free_port(), groups, serve_py)

    with pytest.raises(say.Die) as failed:
        server.start(model, 600)

    log = run_dir / "logs" / "vllm.log"
    assert (failed.value.code, failed.value.message) == (1, f"vLLM failed to start 3 times; see {log}")
    err = capsys.readouterr().err
    exits = re.findall(r"\[baton\] warning: vLLM exited during its start-up \(after \d+s\); last lines of", err)
    assert len(exits) == 3
    assert "boom: cannot load the model\n" in err and "did not become healthy" not in err
    assert groups.recorded("vllm") is None


def test_start_of_a_command_line_vllm_s_parser_refuses_is_exit_2_at_once_naming_the_setting(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM exits 2 at its start with argparse's `usage:` and `PROG: error: MSG` (an extra_args flag it does not
    know): bad input, not a failed start to try again."""
    tries = tmp_path / "tries"
    serve_py = script(
        tmp_path / "bin" / "refuses",
        f'echo x >>{tries}; echo "usage: api_server.py [-h] [--model MODEL]" >&2; '
        'echo "api_server.py: error: unrecognized arguments: --bogus" >&2; exit 2',
    )
    settings = resolve(VllmConfig(extra_args=["--bogus"]), Machine("cpu", 0, 1), SHAPE, "")
    server = policy_server(run_dir, free_port(), groups, serve_py, settings=settings)

    with pytest.raises(say.Die) as refused:
        server.start(model, 600)

    assert (refused.value.code, refused.value.message) == (
        2,
        "vLLM refused its command line: unrecognized arguments: --bogus; set vllm_config.extra_args to what vLLM "
        "takes (docs/serving.md; run.sh --dry-run checks the command line with vLLM's parser)",
    )
    assert tries.read_text() == "x\n" and "warning" not in capsys.readouterr().err
    assert groups.recorded("vllm") is None


def test_start_a_server_that_never_answers_times_out_each_attempt_ticking_the_watches(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = policy_server(run_dir, free_port(), groups, script(tmp_path / "bin" / "mute", "exec sleep 300"))
    ticks: list[float] = []
    server.supervisor.add(lambda: ticks.append(time.monotonic()))

    with pytest.raises(say.Die):
        server.start(model, 0.5)

    err = capsys.readouterr().err
    assert err.count("vLLM did not become healthy within 0.5s (BATON_VLLM_START_S); last lines of") == 3
    assert len(ticks) >= 3
    assert groups.recorded("vllm") is None


def test_a_watch_that_ends_the_run_ends_the_wait(tmp_path: Path, run_dir: Path, groups: Groups, model: str) -> None:
    server = policy_server(run_dir, free_port(), groups, script(tmp_path / "bin" / "mute", "exec sleep 300"))

    def peer_died() -> None:
        raise say.Die(3, "a peer died")

    server.supervisor.add(peer_died)
    began = time.monotonic()
    with pytest.raises(say.Die, match="a peer died"):
        server.start(model, 600)
    assert time.monotonic() - began < 30
    assert groups.leader_alive("vllm")  # left for the run's clean-up to stop


def test_start_of_a_model_that_cannot_be_sized_is_exit_2_and_starts_nothing(
    tmp_path: Path, run_dir: Path, groups: Groups, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "models" / "empty"
    empty.mkdir(parents=True)
    with pytest.raises(say.Die) as bad:
        policy_server(run_dir, free_port(), groups, fake_serve_py(tmp_path)).start(str(empty))
    assert (bad.value.code, bad.value.message) == (2, f"cannot choose how to serve {empty} (message above)")
    assert f"[baton] error: model config {empty / 'config.json'} is not readable JSON" in capsys.readouterr().err
    assert groups.recorded("vllm") is None


# --- reload, sleep, fingerprint, stop ---------------------------------------------------------------


def test_reload_reloads_then_resets_the_caches_and_fails_when_one_was_not_reset(
    run_dir: Path, groups: Groups, model: str
) -> None:
    port = free_port()
    serve(groups, port, "policy", model)
    server = policy_server(run_dir, port, groups)
    assert server.reload("/p/v1")
    assert server.fingerprint() == '[["/p/v1", -0.25]]'  # the fake serves what it reloaded
    groups.stop("vllm", 2)

    port = free_port()
    serve(groups, port, "policy", model, "--prefix-cache-held")
    assert not policy_server(run_dir, port, groups).reload("/p/v1")
    groups.stop("vllm", 2)

    port = free_port()
    serve(groups, port, "policy", model, "--no-reload")
    assert not policy_server(run_dir, port, groups).reload("/p/v1")
    groups.stop("vllm", 2)

    # a vision-language model's encoder cache must go too: kept, a request with an image seen before kills vLLM
    port = free_port()
    serve(groups, port, "policy", model, "--no-encoder-reset")
    assert not policy_server(run_dir, port, groups).reload("/p/v1")


def test_sleep_and_wake_post_on_a_gpu_only(
    run_dir: Path, groups: Groups, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nothing = policy_server(run_dir, free_port(), groups)
    assert nothing.sleep() and nothing.wake()  # CPU: nothing to free, nothing asked
    monkeypatch.setenv("BATON_DEVICE", "cuda")
    assert not nothing.sleep() and not nothing.wake()
    port = free_port()
    serve(groups, port, "policy", model)
    server = policy_server(run_dir, port, groups)
    assert server.sleep() and server.wake()


def test_fingerprint_is_empty_without_a_server(run_dir: Path, groups: Groups, capsys) -> None:
    port = free_port()
    assert policy_server(run_dir, port, groups).fingerprint() == ""
    err = capsys.readouterr().err
    assert f"[baton] warning: no fingerprint from http://127.0.0.1:{port}/v1: " in err
    assert "the run goes on" in err


def test_a_server_that_does_not_answer_the_fingerprint_leaves_the_watches_ticking(
    run_dir: Path, groups: Groups, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a loaded vLLM may take its whole timeout to answer: the heartbeat's watch must not wait with it
    monkeypatch.setattr(vllm, "FINGERPRINT_S", 1.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # connects, never answers
    try:
        server = policy_server(run_dir, silent.getsockname()[1], groups)
        ticks: list[float] = []
        server.supervisor.add(lambda: ticks.append(time.monotonic()))
        assert server.fingerprint() == ""
        assert len(ticks) >= 2  # a wait of 1 s, looked at every 0.05 s; none while the request blocked the driver
    finally:
        silent.close()
    assert "[baton] warning: no fingerprint from" in capsys.readouterr().err


def test_stop_stops_the_recorded_server_and_forgets_its_weights(run_dir: Path, groups: Groups, model: str) -> None:
    port = free_port()
    pgid = serve(groups, port, "policy", model)
    server = policy_server(run_dir, port, groups)
    assert server.recorded_weights() == ""
    server.record_weights(model)
    assert server.recorded_weights() == model

    server.stop()

    assert not group_alive(pgid) and not healthy(port)
    assert groups.recorded("vllm") is None and server.recorded_weights() == ""
    server.stop()  # nothing recorded: nothing to do


# --- serve_new --------------------------------------------------------------------------------------


def started(tmp_path: Path, run_dir: Path, groups: Groups, model: str, *flags: str) -> tuple[PolicyServer, int]:
    """A server started on `model` by PolicyServer.start, its fake given `flags`; and its group id."""
    server = policy_server(run_dir, free_port(), groups, fake_serve_py(tmp_path, *flags))
    server.start(model)
    return server, groups.recorded("vllm")[0]


def test_serve_new_keeps_an_in_place_reload_that_changes_the_served_outputs(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, pgid = started(tmp_path, run_dir, groups, model)
    new = str(model_folder(tmp_path / "policy" / "v1"))

    assert server.serve_new(new) == "reload"

    assert re.search(
        rf"\[baton\] vLLM reloaded {re.escape(new)} in place in \d+\.\ds \(served outputs changed\)",
        capsys.readouterr().err,
    )
    assert groups.recorded("vllm")[0] == pgid  # no restart
    assert server.recorded_weights() == new


def test_serve_new_asks_for_one_fingerprint_per_reload_the_old_one_known_since_the_start(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str
) -> None:
    """vLLM's first request with logprobs is slow (seconds on a CPU): the start pays it, and each reload asks
    only for the new weights' fingerprint, comparing it with the one the last start or reload took."""
    server, _ = started(tmp_path, run_dir, groups, model)
    completions = lambda: int(urllib.request.urlopen(f"http://127.0.0.1:{server.port}/fake/completions").read())  # noqa: E731
    assert completions() == 1 and server.served_fingerprint == json.dumps([[model, -0.25]])

    for version in (1, 2):
        new = str(model_folder(tmp_path / "policy" / f"v{version}"))
        assert server.serve_new(new) == "reload"
        assert completions() == 1 + version and server.served_fingerprint == json.dumps([[new, -0.25]])


def test_serve_new_falls_back_to_a_restart_when_the_reload_is_refused(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, pgid = started(tmp_path, run_dir, groups, model, "--no-reload")
    new = str(model_folder(tmp_path / "policy" / "v1"))

    assert server.serve_new(new) == "restart"

    err = capsys.readouterr().err
    assert f"[baton] warning: in-place reload is unavailable on port {server.port}; restarting vLLM on {new}" in err
    assert groups.recorded("vllm")[0] != pgid and not group_alive(pgid)
    assert server.serves(new) and server.recorded_weights() == new


def test_serve_new_checks_a_reload_that_changes_nothing_by_a_restart_and_says_unchanged(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, pgid = started(tmp_path, run_dir, groups, model, "--same-outputs")
    new = str(model_folder(tmp_path / "policy" / "v1"))

    assert server.serve_new(new) == "unchanged"

    err = capsys.readouterr().err
    assert f"in-place reload left the served outputs unchanged; restarting vLLM on {new} to make sure" in err
    assert f"the new policy {new} gives the same greedy outputs as the old one" in err
    assert groups.recorded("vllm")[0] != pgid and server.serves(new)


def test_serve_new_restarts_on_a_tied_head_model_without_its_head_in_its_files(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(model_folder(tmp_path / "base", tied=True, tensors=("model.embed_tokens.weight", "model.norm.weight")))
    head = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    v1 = str(model_folder(tmp_path / "v1", tied=True, tensors=head))
    server, pgid = started(tmp_path, run_dir, groups, model)

    assert server.serve_new(base) == "restart"  # the fake would have shown a reload: none was tried

    assert (
        f"[baton] warning: {base} ties its output head to model.embed_tokens.weight and holds no lm_head.weight; "
        "restarting vLLM on it (an in-place reload would keep the old output head)"
    ) in capsys.readouterr().err
    assert groups.recorded("vllm")[0] != pgid
    assert server.serve_new(v1) == "reload"


# --- the dry run's check of the command line ---------------------------------------------------------------------


def test_the_dry_run_has_vllm_s_parser_check_the_command_line_with_its_variables(
    tmp_path: Path, run_dir: Path, groups: Groups, model: str
) -> None:
    """coordinator/vllm_argcheck.py runs in the serve environment (here a stand-in that answers as it would):
    a refusal is exit 2 with vLLM's words and the setting behind the refused flag; a check that cannot run, 1."""
    from coordinator.driver.dryrun import check_serve

    seen = tmp_path / "seen"
    serve_py = script(
        tmp_path / "bin" / "serve-python",
        f'printf "%s\\n" "$VLLM_SERVER_DEV_MODE" "$@" >{seen}; echo "INFO vLLM says hello"; '
        'echo "refused: argument --limit-mm-per-prompt: Value {bad cannot be converted"; exit 2',
    )
    settings = resolve(VllmConfig(limit_mm_per_prompt={"video": 0}), Machine("cpu", 0, 1), SHAPE, "")
    server = policy_server(run_dir, 8999, groups, serve_py, settings=settings)
    server.choose(model, record=False)

    with pytest.raises(say.Die) as refused:
        check_serve(server, model)

    assert (refused.value.code, refused.value.message) == (
        2,
        "vLLM's parser refuses the server's command line: argument --limit-mm-per-prompt: Value {bad cannot be "
        "converted; set vllm_config.limit_mm_per_prompt to what vLLM takes (docs/serving.md)",
    )
    checked = seen.read_text().splitlines()
    assert checked[:3] == ["1", "-I", str(Path(__file__).resolve().parents[3] / "coordinator" / "vllm_argcheck.py")]
    assert checked[3:] == server.args(model)  # the server's arguments, as after its entry
    broken = script(tmp_path / "bin" / "broken", 'echo "ModuleNotFoundError: No module named vllm" >&2; exit 1')
    server.serve_py = broken
    with pytest.raises(say.Die) as cannot:
        check_serve(server, model)
    assert cannot.value.code == 1 and "ModuleNotFoundError: No module named vllm" in cannot.value.message
    server.serve_py = script(tmp_path / "bin" / "accepts", "exit 0")
    check_serve(server, model)
