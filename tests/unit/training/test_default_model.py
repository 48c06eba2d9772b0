"""Preparing the default model on a data path that nodes share without a shared lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import default_model
from training.default_model import MANIFEST, is_valid, sha256_file


def built(folder: Path, weights: str) -> None:
    """What a finished conversion leaves: the files and a manifest of their checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_text(weights)
    files = {"model.safetensors": sha256_file(folder / "model.safetensors")}
    (folder / MANIFEST).write_text(json.dumps({"files": files}))


def test_a_folder_another_node_renamed_in_meanwhile_is_kept_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes convert at once (sshfs shares no lock): the one that finishes second keeps the first's
    folder, which the first node's vLLM may be reading, and leaves no staging folder behind."""
    target = tmp_path / "models" / default_model.MODEL_NAME

    def convert_while_the_other_node_finishes(gguf: Path, out_dir: Path) -> None:
        built(target, "the other node's\n")
        (out_dir / "model.safetensors").write_text("ours\n")

    monkeypatch.setattr(default_model, "fetch_gguf", lambda cache: cache / "model.gguf")
    monkeypatch.setattr(default_model, "convert", convert_while_the_other_node_finishes)
    target.parent.mkdir(parents=True)
    assert default_model._prepare(target, tmp_path / "cache") == target
    assert (target / "model.safetensors").read_text() == "the other node's\n" and is_valid(target)
    assert [p.name for p in target.parent.iterdir()] == [target.name]
