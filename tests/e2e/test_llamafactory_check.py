"""phase=check asks LLaMA-Factory about the update config (train environment subprocess, one for every case)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import train_script_result

# a real LLaMA-Factory on the default model (prepared from its PyPI wheel on first use): not a unit test
pytestmark = pytest.mark.e2e

CASES = {
    "default": "",
    "template": "model_config.template=nonsense",
    "mismatch": "model_config.template=qwen3",
    "system": "model_config.template=chatml,model_config.default_system=null",
    "scheduler": "algorithm.lr_scheduler_type=bogus",
    "override": "+algorithm.llamafactory_overrides.no_such_key=1",
}


def test_llamafactory_accepts_the_defaults_and_rejects_what_it_does_not_know(model_dir: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "log"
    result = train_script_result(
        "tests/e2e/check_with_llamafactory.py", str(model_dir), str(log_path),
        *(f"{name}={overrides}" for name, overrides in CASES.items()),
        waiting_for="LLaMA-Factory's check of each case",
    )  # fmt: skip
    assert result["default"]["exit"] == 0, result["default"]["log"]
    assert "LLaMA-Factory accepts this config (stage sft, cpu)" in result["default"]["log"]
    # the training template found from SmolLM2's own chat template, with the system prompt it inserts
    smollm = (
        "chat template: smollm2 (default_system 'You are a helpful AI assistant named SmolLM, trained by Hugging Face')"
    )
    assert smollm in result["default"]["log"]
    assert {name: case["exit"] for name, case in result.items() if name != "default"} == {
        "template": 2,
        "mismatch": 2,
        "system": 2,
        "scheduler": 2,
        "override": 2,
    }
    assert (
        "model_config.template='nonsense' is not a LLaMA-Factory template; one of: smollm2, chatml, llama3"
        in (result["template"]["log"])
    )
    mismatch = result["mismatch"]["log"]
    assert "model_config.template='qwen3' does not render" in mismatch, mismatch
    assert "these do: smollm2," in mismatch and "(set model_config.template=smollm2, or auto)" in mismatch
    # chatml with no system prompt where SmolLM2's template inserts one: no template renders that; with the
    # model's own system prompt several do
    system = result["system"]["log"]
    assert "model_config.template='chatml' does not render" in system, system
    assert "try model_config.default_system=auto (the model's own system prompt: then smollm2, " in system
    # the schema's choices (rollout_engine/schema.py) refuse it before LLaMA-Factory is asked; the override below
    # is one only LLaMA-Factory's own parser can refuse
    assert "algorithm.lr_scheduler_type must be one of linear, cosine," in result["scheduler"]["log"]
    assert (
        "no_such_key" in result["override"]["log"] and "algorithm.llamafactory_overrides" in (result["override"]["log"])
    )
    assert not log_path.exists()  # the check writes nothing
