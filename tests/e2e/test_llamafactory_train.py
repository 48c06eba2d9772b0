"""A real `llamafactory-cli train` run in the train environment: two optimizer
steps of full fine-tuning on a few samples of the default model, and the saved
model loads and generates."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import env_python
from tests.waits import UPDATE_S, run_waiting

pytestmark = pytest.mark.e2e

SYSTEM = "You are a careful calculator."
SAMPLES = [(f"What is {a} + {b}? Answer with only the final number.", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 1)]]

LOAD_AND_GENERATE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, base = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
ref = AutoModelForCausalLM.from_pretrained(base)
diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
ids = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True, return_tensors="pt")
ids = ids["input_ids"] if hasattr(ids, "keys") else ids
out = model.generate(ids, max_new_tokens=4, do_sample=False)
print(f"DIFF={diff} NEW_TOKENS={out.shape[1] - ids.shape[1]}")
"""


def _write_dataset(root: Path) -> None:
    rows = [
        {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}], "system": SYSTEM}
        for q, a in SAMPLES * 2
    ]
    (root / "finetune.json").write_text(json.dumps(rows))
    info = {
        "baton": {
            "file_name": "finetune.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system"},
        }
    }
    (root / "dataset_info.json").write_text(json.dumps(info))


def test_two_steps_of_full_finetuning(model_dir: Path, tmp_path: Path) -> None:
    _write_dataset(tmp_path)
    out_dir = tmp_path / "out"
    config = {
        "model_name_or_path": str(model_dir),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "baton",
        "dataset_dir": str(tmp_path),
        "template": "smollm2",
        "cutoff_len": 128,
        "output_dir": str(out_dir),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "learning_rate": 1.0e-4,
        "logging_steps": 1,
        "save_strategy": "no",
        "bf16": False,
        "report_to": "none",
        "preprocessing_num_workers": 1,
        "dataloader_num_workers": 0,
    }
    cfg = tmp_path / "train.yaml"
    cfg.write_text(json.dumps(config))  # JSON is valid YAML
    train_py = env_python("train")
    env = {**os.environ, "PATH": f"{Path(train_py).parent}:{os.environ['PATH']}", "DISABLE_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    result = run_waiting(
        [str(Path(train_py).parent / "llamafactory-cli"), "train", str(cfg)],
        waiting_for="llamafactory-cli train (2 optimizer steps)",
        timeout=UPDATE_S,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out_dir / "model.safetensors").is_file()
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert all("loss" in entry for entry in state["log_history"][:2])

    check = run_waiting(
        [train_py, "-c", LOAD_AND_GENERATE, str(out_dir), str(model_dir)],
        waiting_for="the trained model to load and generate",
        timeout=300,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    stats = dict(item.split("=") for item in check.stdout.split() if "=" in item)
    assert float(stats["DIFF"]) > 0, "training must change the weights"
    assert int(stats["NEW_TOKENS"]) > 0
