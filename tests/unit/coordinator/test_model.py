"""The run's model: found from model_config (a folder, a Hub id in a Hugging Face cache), checked, pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.model import (
    ModelNotFound,
    find_model,
    load_model_record,
    mismatch,
    model_problems,
    model_record,
    reasoning_of,
    save_model_record,
)
from rollout_engine.config import ModelConfig

THINKING = "{% for m in messages %}{{ m.content }}{% endfor %}{% if x %}</think>{% endif %}"


def model(folder: Path, template: str | None = "{{ messages }}", **config: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", **config}))
    (folder / "tokenizer.json").write_text("{}")
    settings = {"chat_template": template} if template is not None else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def hub(cache: Path, repo_id: str, revision: str = "abc123") -> Path:
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return model(repo / "snapshots" / revision)


def test_the_shipped_model_a_folder_and_a_folder_relative_to_the_data_path(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert find_model(data, ModelConfig()).path == data / "models" / "SmolLM2-135M-Instruct"
    folder = model(tmp_path / "mine")
    assert find_model(data, ModelConfig(model=str(folder))).source == "folder"
    model(data / "models" / "other")
    found = find_model(data, ModelConfig(model="models/other"))
    assert (found.path, found.source) == (data / "models" / "other", "folder")


def test_a_hub_id_is_found_in_the_data_paths_cache_first_then_this_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, home = tmp_path / "data", tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    in_home = hub(home / "hub", "Org/Model", "r1")
    found = find_model(data, ModelConfig(model="Org/Model"))
    assert (found.path, found.source) == (in_home, "hub cache")
    in_data = hub(data / ".cache" / "huggingface" / "hub", "Org/Model", "r2")
    assert find_model(data, ModelConfig(model="Org/Model")).path == in_data
    # the reference's names stand for its Hub models
    qwen = hub(data / ".cache" / "huggingface" / "hub", "Qwen/Qwen3-VL-8B-Thinking")
    assert find_model(data, ModelConfig(model_type="qwen3-think")).path == qwen


def test_a_hub_id_no_cache_holds_is_to_be_downloaded_and_anything_else_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    found = find_model(tmp_path / "data", ModelConfig(model="Org/Missing"))
    assert found.source == "download" and found.cache == tmp_path / "data" / ".cache" / "huggingface" / "hub"
    for bad in ("/no/such/folder", "not a model", "a/b/c"):
        with pytest.raises(ModelNotFound, match=r"model_config.model=.* is not a folder .* nor a Hugging Face Hub id"):
            find_model(tmp_path / "data", ModelConfig(model=bad))


def test_a_folder_without_config_tokenizer_or_chat_template_or_of_an_unknown_vision_family_is_refused(
    tmp_path: Path,
) -> None:
    assert model_problems(model(tmp_path / "ok")) == []
    assert "holds no config.json" in model_problems(tmp_path / "nothing")[0]
    bare = model(tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    assert "holds no tokenizer files" in model_problems(bare)[0]
    assert "has no chat template" in model_problems(model(tmp_path / "base", template=None))[0]
    jinja = model(tmp_path / "jinja", template=None)
    (jinja / "chat_template.jinja").write_text("{{ messages }}")
    assert model_problems(jinja) == []
    # a vision-language model is served and trained when its family's whole way is known (Qwen-VL)
    vision = {"vision_config": {"depth": 2}, "text_config": {"num_hidden_layers": 2}}
    assert model_problems(model(tmp_path / "qwen3vl", **{**vision, "model_type": "qwen3_vl"})) == []
    assert model_problems(model(tmp_path / "qwen25vl", **{**vision, "model_type": "qwen2_5_vl"})) == []
    llava = model_problems(model(tmp_path / "llava", **{**vision, "model_type": "llava"}))
    assert len(llava) == 1 and "of a family Baton does not send images to yet (model_type 'llava')" in llava[0]
    assert "Qwen3-VL (model_type qwen3_vl, qwen3_vl_moe)" in llava[0]


def test_reasoning_auto_is_think_when_the_chat_template_knows_the_closing_tag(tmp_path: Path) -> None:
    assert reasoning_of(model(tmp_path / "plain"), "auto") == "none"
    assert reasoning_of(model(tmp_path / "thinks", template=THINKING), "auto") == "think"
    assert reasoning_of(model(tmp_path / "forced"), "think") == "think"


def test_the_record_pins_the_files_not_the_path_and_a_mismatch_names_both(tmp_path: Path) -> None:
    log = tmp_path / "log"
    a = model(tmp_path / "a")
    b = model(tmp_path / "b")  # the same files elsewhere
    other = model(tmp_path / "other", hidden_size=128)
    first = model_record(find_model(tmp_path, ModelConfig(model=str(a))), ModelConfig(model=str(a)), 2048)
    assert mismatch(load_model_record(log), first, log) == ""  # nothing recorded yet
    save_model_record(log, first)
    assert json.loads((log / "model.json").read_text())["identity"] == first["identity"]
    same = model_record(find_model(tmp_path, ModelConfig(model=str(b))), ModelConfig(model=str(b)), 2048)
    assert mismatch(load_model_record(log), same, log) == ""
    wrong = model_record(find_model(tmp_path, ModelConfig(model=str(other))), ModelConfig(model=str(other)), 2048)
    why = mismatch(load_model_record(log), wrong, log)
    assert f"would serve and train {other} ({other})" in why and f"this log path's model is {a} ({a})" in why
    kwargs = ModelConfig(model=str(a), chat_template_kwargs={"enable_thinking": False})
    why = mismatch(load_model_record(log), model_record(find_model(tmp_path, kwargs), kwargs, 4096), log)
    assert "model settings" in why and "max_model_len 4096" in why and "max_model_len 2048" in why
    assert "chat_template_kwargs {'enable_thinking': False}" in why
