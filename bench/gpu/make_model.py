"""A random-weight model of a real architecture, with the real config, tokenizer and chat template.

The default model's weights would travel to a GPU machine too, but a random model of the same
config measures the same thing (start-up, memory, optimizer steps, dtypes) and needs nothing
but config.json. usage: python make_model.py SRC_DIR DST_DIR
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path


def main(src: Path, dst: Path) -> None:
    import torch  # the train environment's (or a GPU machine's), not the app environment's
    from transformers import AutoConfig, AutoModelForCausalLM

    started = time.time()
    dst.mkdir(parents=True, exist_ok=True)
    cfg = AutoConfig.from_pretrained(src)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(dst, safe_serialization=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {type(model).__name__}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{params / 1e6:.1f}M parameters, bf16, tied head {cfg.tie_word_embeddings}, in {time.time() - started:.1f} s"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
