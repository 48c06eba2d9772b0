"""Run in the train environment: write a dataset per stage, load it with LLaMA-Factory's loader, print JSON.

python tests/unit/training/load_with_llamafactory.py <model_dir> <out_dir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.unit.training.trajectories import traj, turn
from training.dataset import save_dataset
from training.fidelity import _load
from training.selection import DPOSelector, KTOSelector, RFTSelector


def main(model: str, out: Path) -> None:
    second = turn(1, response="7")
    second.messages = [
        {"role": "user", "content": "2+5?"},
        {"role": "assistant", "content": "look"},
        {"role": "user", "content": "obs"},
    ]
    trajectories = [
        traj("a", 0, True, turns=[turn(0, response="look"), second]),
        traj("a", 1, False, turns=[turn(0, response="8")]),
    ]
    selectors = {"sft": RFTSelector(), "kto": KTOSelector(), "dpo": DPOSelector()}
    result = {}
    for stage, selector in selectors.items():
        files = save_dataset(selector.select(trajectories, 0, 2048).samples, out / stage, stage)
        recipe = {
            "model_name_or_path": model,
            "stage": stage,
            "do_train": True,
            "dataset": "baton_train",
            "dataset_dir": str(files.directory),
            "template": "smollm2",
            "output_dir": str(out / "o"),
            "finetuning_type": "full",
            "cutoff_len": 256,
            "mask_history": stage == "sft",
            "report_to": "none",
        }
        _, rows = _load(recipe, "baton_train")
        result[stage] = [{k: row[k] for k in ("_prompt", "_response", "_system")} for row in rows]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
