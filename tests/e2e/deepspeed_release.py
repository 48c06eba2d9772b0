"""Run in the train environment: DeepSpeed trainings in this process, one per ZeRO stage named, each followed by
training.warm.release_memory as the warm trainer's worker runs it after a job; print what outlived them.

python tests/e2e/deepspeed_release.py STAGE...

Each training is a small model's two optimizer steps through deepspeed.initialize (gloo, one rank, on the CPU);
nothing of it is referenced once it returns. Prints `RESULT {"<stage>": {"model_alive": bool, "tensors_alive_mib":
float}, ...}`: whether the model object is still alive after release_memory (a weak reference), and the tensors
still alive in the process (training.warm.tensors_alive_mib, after every training so far).
"""

from __future__ import annotations

import json
import os
import sys
import weakref

import torch

from training.launch import free_port
from training.warm import release_memory, tensors_alive_mib


def train(stage: int) -> weakref.ref:
    import deepspeed

    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for _ in range(2):
        loss = engine(torch.randn(2, 512)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    return weakref.ref(model)


def main(stages: list[int]) -> int:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result = {}
    for stage in stages:
        model = train(stage)
        release_memory(torch)
        result[str(stage)] = {"model_alive": model() is not None, "tensors_alive_mib": tensors_alive_mib()}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(stage) for stage in sys.argv[1:]]))
