"""Serving dtype and KV-cache size chosen from canned /proc/cpuinfo texts and GPU capabilities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.serving import (
    choose_dtype,
    kv_bytes_per_token,
    kv_cache_gib,
    load_model_config,
    model_config_problem,
    parse_cpuinfo,
    served_dtype,
    text_config,
)
from tests.conftest import REPO

# The 2-core AMD EPYC this issue was measured on: AVX2, no AVX-512 at all.
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm rep_good nopl cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 \
fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a \
misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 rdseed adx smap \
clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero xsaveerptr wbnoinvd arat npt nrip_save umip rdpid

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx avx2
"""
# Ice Lake server: AVX-512 but no bf16 instructions (AVX-512 alone does not make bf16 native).
ICELAKE_AVX512 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl \
avx512_vnni avx512_vbmi
"""
# Sapphire Rapids: AMX and AVX512_BF16.
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
# Zen 4: avx512_bf16 without AMX.
ZEN4 = """processor\t: 0
model name\t: AMD EPYC 9454 48-Core Processor
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni
"""
# Graviton 3 (aarch64): the Features line, with bf16.
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
"""
# Graviton 2 (aarch64): no bf16.
GRAVITON2 = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
"""

# SmolLM2-135M-Instruct's config.json (the parts the KV cache depends on).
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


@pytest.mark.parametrize(
    ("cpuinfo", "dtype"),
    [
        (EPYC_AVX2, "float32"),
        (ICELAKE_AVX512, "float32"),
        (SAPPHIRE_RAPIDS, "bfloat16"),
        (ZEN4, "bfloat16"),
        (GRAVITON3, "bfloat16"),
        (GRAVITON2, "float32"),
        ("", "float32"),
    ],
)
def test_cpu_serves_bf16_only_with_native_bf16(cpuinfo: str, dtype: str) -> None:
    assert choose_dtype("cpu", cpuinfo).dtype == dtype


def test_the_reason_names_what_decided() -> None:
    assert choose_dtype("cpu", EPYC_AVX2).reason == "this CPU has no native bf16 (avx512_bf16/amx_bf16 absent)"
    assert choose_dtype("cpu", SAPPHIRE_RAPIDS).reason == "this CPU has native bf16 (avx512_bf16, amx_bf16)"


def test_cpuinfo_parse_keeps_model_and_the_flags_worth_recording() -> None:
    info = parse_cpuinfo(EPYC_AVX2)
    assert info.model == "AMD EPYC"
    assert info.relevant_flags() == ["avx", "avx2", "f16c", "fma", "sse4_1", "sse4_2", "sse4a"]
    assert "asimd" in parse_cpuinfo(GRAVITON3).relevant_flags()


@pytest.mark.parametrize(
    ("caps", "dtype"),
    [(["9.0"], "bfloat16"), (["8.0", "8.0"], "bfloat16"), (["7.0"], "float16"), (["8.6", "7.5"], "float16")],
)
def test_gpu_serves_bf16_from_ampere_on(caps: list[str], dtype: str) -> None:
    assert choose_dtype("cuda", "", caps).dtype == dtype


@pytest.mark.parametrize("forced", ["float32", "bfloat16", "float16"])
def test_the_override_wins_over_detection(forced: str) -> None:
    choice = choose_dtype("cpu", SAPPHIRE_RAPIDS if forced == "float32" else EPYC_AVX2, forced=forced)
    assert (choice.dtype, choice.forced) == (forced, True)
    assert choose_dtype("cpu", EPYC_AVX2, forced="auto").forced is False


def test_a_bad_override_names_the_variable_and_the_fix() -> None:
    expected = r"BATON_VLLM_DTYPE must be one of float32, bfloat16, float16 or auto \(got 'fp32'\)"
    with pytest.raises(ValueError, match=expected):
        choose_dtype("cpu", EPYC_AVX2, forced="fp32")


def test_the_served_dtype_the_update_is_told_is_this_machines_choice_and_empty_for_a_bad_override(
    tmp_path: Path,
) -> None:
    (tmp_path / "avx2").write_text(EPYC_AVX2)
    (tmp_path / "spr").write_text(SAPPHIRE_RAPIDS)
    assert served_dtype("cpu", cpuinfo=tmp_path / "avx2") == "float32"
    assert served_dtype("cpu", cpuinfo=tmp_path / "spr") == "bfloat16"
    assert served_dtype("cpu", "bfloat16", cpuinfo=tmp_path / "avx2") == "bfloat16"
    assert served_dtype("cpu", "fp32", cpuinfo=tmp_path / "avx2") == ""  # vLLM's start refuses it, exit 2


def test_kv_cache_holds_every_session_at_full_length() -> None:
    # 2 (K and V) x 30 layers x 3 KV heads x 64 dims = 11520 elements per token
    assert kv_bytes_per_token(SMOLLM2, "float32") == 46080
    assert kv_bytes_per_token(SMOLLM2, "bfloat16") == 23040
    # 32 x 2048 tokens x 46080 B = 2.81 GiB, with headroom 3.24 -> 4 GiB; half that in bf16
    assert kv_cache_gib(SMOLLM2, "float32", 32, 2048) == 4
    assert kv_cache_gib(SMOLLM2, "bfloat16", 32, 2048) == 2
    assert kv_cache_gib(SMOLLM2, "float32", 1, 128) == 1
    fits = kv_cache_gib(SMOLLM2, "float32", 64, 2048) * 2**30
    assert fits >= 64 * 2048 * 46080


def test_tensor_and_data_parallel_workers_each_hold_their_share_of_the_kv_cache() -> None:
    """VLLM_CPU_KVCACHE_SPACE is each worker's: a tensor-parallel rank holds its share of the KV heads (at least
    one: vLLM copies a head when there are more ranks than heads), a data-parallel copy its share of the requests."""
    # 3 KV heads over 2 ranks: 2 heads each, 2/3 of 4 GiB -> 3 GiB
    assert kv_bytes_per_token(SMOLLM2, "float32", tensor_parallel=2) == 46080 * 2 // 3
    assert kv_cache_gib(SMOLLM2, "float32", 32, 2048, tensor_parallel=2) == 3
    assert kv_bytes_per_token(SMOLLM2, "float32", tensor_parallel=8) == 46080 // 3
    assert kv_cache_gib(SMOLLM2, "float32", 32, 2048, data_parallel=2) == 2


#: Qwen3-VL-8B-Instruct's config.json, abridged: the language model's shape is under text_config
QWEN3_VL = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 4096,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "num_heads": 16},
}


def test_a_vision_language_config_is_sized_from_its_text_config(tmp_path: Path) -> None:
    assert text_config(QWEN3_VL) is QWEN3_VL["text_config"] and text_config(SMOLLM2) is SMOLLM2
    assert model_config_problem(QWEN3_VL) is None
    # 2 x 36 layers x 8 KV heads x 128 dims x 2 bytes
    assert kv_bytes_per_token(QWEN3_VL, "bfloat16") == 147456
    assert model_config_problem({"text_config": {"hidden_size": 64}}) == "lacks num_hidden_layers (missing)"
    assert model_config_problem({"text_config": [1]}) == "lacks num_hidden_layers (missing)"
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_VL))
    assert load_model_config(tmp_path) == QWEN3_VL
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 0}}))
    with pytest.raises(ValueError, match=r"config.json num_hidden_layers must be an integer >= 1 \(got 0\)"):
        load_model_config(tmp_path)


def run_serving(tmp_path: Path, cpuinfo: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    cmd = [sys.executable, "-m", "coordinator", "serving", "--device", "cpu"]
    cmd += ["--model", str(tmp_path / "model"), "--sessions", "32", "--cpuinfo", str(tmp_path / "cpuinfo")]
    cmd += ["--record", str(tmp_path / "serving.json")]
    environ = {k: v for k, v in os.environ.items() if k != "BATON_VLLM_DTYPE"}
    return subprocess.run(cmd, cwd=REPO, env={**environ, **env}, capture_output=True, text=True, check=False)


def test_cli_prints_the_choice_and_records_it_with_the_cpu(tmp_path: Path) -> None:
    out = run_serving(tmp_path, EPYC_AVX2)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "float32\t4\tthis CPU has no native bf16 (avx512_bf16/amx_bf16 absent)\n"
    record = json.loads((tmp_path / "serving.json").read_text())
    assert (record["dtype"], record["kv_cache_gib"], record["cpu_model"]) == ("float32", 4, "AMD EPYC")
    assert "avx2" in record["cpu_flags"] and record["forced"] is False


def test_cli_refuses_a_bad_override_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    out = run_serving(tmp_path, EPYC_AVX2, BATON_VLLM_DTYPE="half")
    assert out.returncode == 2
    assert "BATON_VLLM_DTYPE must be one of float32, bfloat16, float16 or auto (got 'half')" in out.stderr
    assert not (tmp_path / "serving.json").exists()
