"""Reading a model folder's tensor names from safetensors headers, and when a tied output head is missing."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rollout_engine.checkpoint import HEAD, header_names, missing_tied_head, tensor_files


def write_safetensors(path: Path, *names: str) -> None:
    """A valid safetensors file holding one float32 per name (header, then the data)."""
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4 * len(names)))


def model(folder: Path, config: dict, **files: tuple[str, ...]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for name, tensors in files.items():
        write_safetensors(folder / f"{name}.safetensors", *tensors)
    return folder


def test_header_names_leave_out_the_metadata(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "m.safetensors", "a.weight", "b.weight")
    assert header_names(tmp_path / "m.safetensors") == ["a.weight", "b.weight"]


def test_a_tied_model_without_its_head_names_its_embedding(tmp_path: Path) -> None:
    folder = model(
        tmp_path / "m", {"tie_word_embeddings": True}, model=("model.embed_tokens.weight", "model.norm.weight")
    )
    assert missing_tied_head(folder) == "model.embed_tokens.weight"


def test_a_head_in_any_file_or_an_untied_config_needs_nothing(tmp_path: Path) -> None:
    tied = {"tie_word_embeddings": True}
    with_head = model(tmp_path / "a", tied, model=("model.embed_tokens.weight",), lm_head=(HEAD,))
    untied = model(tmp_path / "b", {"tie_word_embeddings": False}, model=("model.embed_tokens.weight",))
    no_config = model(tmp_path / "c", {}, model=("model.embed_tokens.weight",))
    assert [missing_tied_head(f) for f in (with_head, untied, no_config)] == [None, None, None]
    assert tensor_files(with_head)[HEAD] == with_head / "lm_head.safetensors"


def test_a_text_config_counts_and_an_index_limits_the_files_read(tmp_path: Path) -> None:
    folder = model(
        tmp_path / "m",
        {"text_config": {"tie_word_embeddings": True}},
        shard1=("transformer.wte.weight",),
        stray=(HEAD,),  # not in the index: a loader never reads it
    )
    index = {"weight_map": {"transformer.wte.weight": "shard1.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert missing_tied_head(folder) == "transformer.wte.weight"
    index["weight_map"][HEAD] = "stray.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert missing_tied_head(folder) is None
