"""`python -m training ...` as a node with N GPUs sees it, on a machine with one.

torch.cuda.device_count() answers N (the one real GPU stays cuda:0); is_bf16_supported answers
for the real one. usage: FAKE_GPUS=2 python fake_gpus.py --config-name update key=value ...
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    import torch  # the train environment's, not the app environment's

    real_bf16 = torch.cuda.is_bf16_supported()
    torch.cuda.device_count = lambda: int(os.environ.get("FAKE_GPUS", "2"))
    torch.cuda.is_bf16_supported = lambda *a, **k: real_bf16
    sys.argv = ["training", *sys.argv[1:]]
    runpy.run_module("training", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
