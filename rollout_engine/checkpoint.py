"""What a model folder's weights hold, read from the safetensors headers (no tensor loaded, no torch).

    names = tensor_files(model_dir)     # {"model.embed_tokens.weight": Path(".../model.safetensors"), ...}
    missing_tied_head(model_dir)        # "model.embed_tokens.weight" when the head must be written, else None

Why it matters: a model whose config ties the output head to the input embeddings
(`tie_word_embeddings`, SmolLM2 among them) is saved without `lm_head.weight`.
vLLM's CPU backend packs the head's weight for its GEMM when it loads, and an
in-place reload (`reload_weights`) of such a checkpoint refreshes the embeddings
but not that packed head: the server then serves new layers under the old
model's head (measured: the greedy logprobs differ from a fresh start on the same
weights). A checkpoint that carries `lm_head.weight` is reloaded exactly. So a
promoted policy gets the head written beside its weights (training/promotion.py),
and a folder without one is served by a restart, not a reload (coordinator/driver/vllm.py PolicyServer.serve_new).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HEAD = "lm_head.weight"
#: the input embedding's tensor name, by architecture family (Llama/Qwen/Mistral/SmolLM, GPT-2/GPT-J)
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight")
HEAD_FILE = "lm_head.safetensors"


def header_names(path: Path) -> list[str]:
    """The tensor names in one safetensors file (its JSON header: 8-byte little-endian length, then JSON)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return [name for name in header if name != "__metadata__"]


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files a loader reads: those the index names when there is one, else every one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        mapping = json.loads(index.read_text()).get("weight_map", {})
        return sorted({model_dir / name for name in mapping.values()})
    return sorted(model_dir.glob("*.safetensors"))


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Every tensor name of the folder's weights, with the file that holds it."""
    return {name: path for path in weight_files(model_dir) for name in header_names(path)}


def ties_embeddings(model_dir: Path) -> bool:
    """config.json says the output head is the input embedding (top level or a text_config)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def missing_tied_head(model_dir: Path) -> str | None:
    """The input embedding's tensor name when the config ties the head to it and no file holds
    `lm_head.weight` (the head must be written for an exact in-place reload); else None."""
    if not ties_embeddings(model_dir):
        return None
    names = tensor_files(model_dir)
    if HEAD in names:
        return None
    return next((name for name in names if name.endswith(EMBEDDING_SUFFIXES)), None)
