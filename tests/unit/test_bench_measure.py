"""bench/measure.py's CPU line, which every benchmark prints beside its figures."""

from __future__ import annotations

import os
from pathlib import Path

from bench.measure import cpu_line

AVX512 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_bf16 hypervisor
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_the_line_names_the_model_the_cores_and_the_flags_a_figure_depends_on(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AVX512)
    assert cpu_line(cpuinfo) == (
        f"Intel(R) Xeon(R) Platinum 8480+, {os.cpu_count()} cores, "
        "flags amx_bf16 avx avx2 avx512_bf16 avx512f fma sse4_2"
    )


def test_a_cpu_without_those_flags_or_without_cpuinfo_still_gets_a_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Some CPU\nflags\t: fpu\n")
    assert cpu_line(cpuinfo) == f"Some CPU, {os.cpu_count()} cores, flags none"
    assert cpu_line(tmp_path / "absent") == f"unknown CPU, {os.cpu_count()} cores"


def test_a_benchmark_s_json_records_the_same_cpu_as_its_line(tmp_path: Path) -> None:
    from bench.measure import cpu_record

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f sse2\n")
    record = cpu_record(cpuinfo)
    assert record == {"model": "Some CPU", "cores": os.cpu_count(), "flags": ["avx2", "avx512f"]}
    assert cpu_line(cpuinfo) == f"Some CPU, {os.cpu_count()} cores, flags avx2 avx512f"
    assert cpu_record(tmp_path / "absent")["model"] is None
