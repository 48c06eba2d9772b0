"""Promotion: versioned folders, the atomic `current` flip, pruning, failure leaves current alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollout_engine.errors import BatonError
from rollout_engine.layout import Layout, version_name
from training import promotion
from training.promotion import promote


def fake_output(path: Path, weights: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text(weights)
    (path / "training_args.bin").write_text("pickle")
    ckpt = path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "optimizer.pt").write_text("opt")
    return path


def test_versions_current_and_pruning(tmp_path: Path) -> None:
    root, base = tmp_path / "policy", tmp_path / "base"
    base.mkdir()
    for i in range(1, 5):
        version = promote(
            fake_output(tmp_path / f"out{i}", f"w{i}"),
            root,
            iteration=i - 1,
            parent_model=root / "current" if i > 1 else base,
            keep_last=2,
        )
        assert version == i and os.readlink(root / "current") == version_name(i)
    assert sorted(p.name for p in root.iterdir() if p.name != ".promote.lock") == ["current", "v0003", "v0004"]
    record = json.loads((root / "current" / "baton_policy.json").read_text())
    assert (record["version"], record["iteration"], record["parent"]) == (4, 3, 3)
    assert (root / "current" / "model.safetensors").read_text() == "w4"
    assert not (root / "v0004" / "training_args.bin").exists() and not (root / "v0004" / "checkpoint-2").exists()
    assert (tmp_path / "out4" / "model.safetensors").read_text() == "w4"  # output kept for a retry


def test_the_carried_optimizer_state_goes_with_the_version_and_a_revert_leaves_it_out(tmp_path: Path) -> None:
    """training.carry's folder: in a full fine-tune's output; beside a LoRA's adapter (`carried`), not in the merged
    folder promoted; a revert's weights are older than the moments, so it starts afresh."""
    root = tmp_path / "policy"
    out = fake_output(tmp_path / "out", "w")
    (out / "optimizer").mkdir()
    (out / "optimizer" / "state.json").write_text("{}")
    promote(out, root, 0, tmp_path, keep_last=3, carried=out / "optimizer")
    merged = fake_output(tmp_path / "merged", "w2")
    adapter = tmp_path / "adapter" / "optimizer"
    adapter.mkdir(parents=True)
    (adapter / "state.json").write_text('{"lora": 1}')
    promote(merged, root, 1, root / "current", keep_last=3, carried=adapter)
    promote(fake_output(tmp_path / "out3", "w3"), root, 2, root / "current", keep_last=3, carried=tmp_path / "none")
    promotion.revert(root / "v0001", root, 3, 1, {"rule": "--keep-best"}, keep_last=5)

    def record(version: str) -> bool:
        return json.loads((root / version / "baton_policy.json").read_text())["optimizer_state"]

    assert (root / "v0001" / "optimizer" / "state.json").read_text() == "{}" and record("v0001")
    assert (root / "v0002" / "optimizer" / "state.json").read_text() == '{"lora": 1}' and record("v0002")
    assert not (root / "v0003" / "optimizer").exists() and not record("v0003")
    assert not (root / "v0004" / "optimizer").exists() and not record("v0004")
    assert (root / "v0004" / "model.safetensors").read_text() == "w"


def test_a_vision_language_policy_keeps_its_processor_files_taking_missing_ones_from_its_parent(
    tmp_path: Path,
) -> None:
    parent = tmp_path / "base"
    parent.mkdir()
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja"):
        (parent / name).write_text(f"parent's {name}")
    out = fake_output(tmp_path / "out", "w")
    (out / "preprocessor_config.json").write_text("trained with")  # what the trainer saved wins
    promote(out, tmp_path / "policy", 0, parent, keep_last=3)
    v1 = tmp_path / "policy" / "v0001"
    assert (v1 / "preprocessor_config.json").read_text() == "trained with"
    assert (v1 / "video_preprocessor_config.json").read_text() == "parent's video_preprocessor_config.json"
    assert (v1 / "chat_template.jinja").is_file() and not (v1 / "processor_config.json").exists()


def test_failed_promotion_leaves_current_and_can_be_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "policy"
    promote(fake_output(tmp_path / "out1", "w1"), root, 0, tmp_path, keep_last=3)
    out2 = fake_output(tmp_path / "out2", "w2")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(promotion, "save_json", broken)
    with pytest.raises(OSError):
        promote(out2, root, 1, root / "current", keep_last=3)
    assert os.readlink(root / "current") == "v0001" and (root / "current" / "model.safetensors").read_text() == "w1"
    monkeypatch.undo()
    assert promote(out2, root, 1, root / "current", keep_last=3) == 2
    assert sorted(p.name for p in root.iterdir() if p.name != ".promote.lock") == [
        "current",
        "v0001",
        "v0002",
    ]  # staging left-over removed


def test_promoting_the_same_iteration_again_reuses_its_version(tmp_path: Path) -> None:
    """A --resume after a crash between the promotion and its record must not promote a copy."""
    root, base = tmp_path / "policy", tmp_path / "base"
    base.mkdir()
    out = fake_output(tmp_path / "out", "w1")
    assert promote(out, root, iteration=4, parent_model=base, keep_last=3) == 1
    assert promote(out, root, iteration=4, parent_model=base, keep_last=3) == 1
    assert [p.name for p in sorted(root.iterdir()) if p.name != ".promote.lock"] == ["current", "v0001"]
    other = fake_output(tmp_path / "out5", "w2")
    assert promote(other, root, iteration=5, parent_model=root / "current", keep_last=3) == 2


def test_concurrent_promotions_never_share_a_version_or_delete_each_others_staging(tmp_path: Path) -> None:
    import multiprocessing

    root, base = tmp_path / "policy", tmp_path / "base"
    base.mkdir()
    outs = [fake_output(tmp_path / f"out{i}", f"w{i}") for i in range(4)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        got = pool.starmap(promote, [(out, root, i, base, 10) for i, out in enumerate(outs)])
    assert sorted(got) == [1, 2, 3, 4]
    iterations = {json.loads((root / version_name(v) / "baton_policy.json").read_text())["iteration"] for v in got}
    assert iterations == {0, 1, 2, 3}
    assert not list(root.glob(".staging-*"))


def test_a_revert_promotes_the_best_weights_once_and_best_is_never_pruned(tmp_path: Path) -> None:
    root, base = tmp_path / "policy", tmp_path / "base"
    fake_output(base, "w0")
    for i in (1, 2):
        promote(fake_output(tmp_path / f"out{i}", f"w{i}"), root, i, root / "current" if i > 1 else base, keep_last=1)
    why = {"replaced": 2, "replaced_success_rate": 0.1, "best_success_rate": 0.3, "margin_points": 0.0}
    assert promotion.revert(base, root, 3, 0, why, keep_last=1) == 3
    record = json.loads((root / "current" / "baton_policy.json").read_text())
    assert (record["version"], record["iteration"], record["parent"], record["reverted_to"]) == (3, 3, 2, 0)
    assert record["why"] == why and (root / "v0003" / "model.safetensors").read_text() == "w0"
    assert (base / "model.safetensors").read_text() == "w0"  # the source is untouched
    # a resumed run reverts the same iteration again: the version it made, not a copy
    assert promotion.revert(base, root, 3, 0, why, keep_last=1) == 3 and promotion.versions(root) == [3]
    # policy/best is kept by pruning like current
    promotion.mark_best(root, 3)
    promote(fake_output(tmp_path / "out4", "w4"), root, 4, root / "current", keep_last=1)
    promote(fake_output(tmp_path / "out5", "w5"), root, 5, root / "current", keep_last=1)
    assert promotion.versions(root) == [3, 5] and os.readlink(root / "best") == "v0003"
    promotion.mark_best(root, None)
    assert not (root / "best").is_symlink()


def safetensors_file(path: Path, dtype: str) -> Path:
    """A real safetensors file of one 2x2 tensor (the format: a little-endian header length, JSON, the data)."""
    width = {"F32": 4, "BF16": 2}[dtype]
    header = json.dumps({"w": {"dtype": dtype, "shape": [2, 2], "data_offsets": [0, 4 * width]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4 * width))
    return path


def test_promoted_files_are_readable_by_other_users_of_the_log_path(tmp_path: Path) -> None:
    out = fake_output(tmp_path / "out", "w")
    (out / "model.safetensors").chmod(0o600)  # how a trainer may save its weights
    promote(out, tmp_path / "policy", 0, tmp_path, keep_last=3)
    version = tmp_path / "policy" / "v0001"
    assert [p.name for p in version.rglob("*") if p.stat().st_mode & 0o044 != 0o044] == []


def test_a_float32_setting_serves_float32_weights_as_the_trainer_saved_them(tmp_path: Path) -> None:
    """promotion.dtype=float32: nothing is cast and no second copy is kept; the next update trains from them."""
    from training.precision import training_weights, weights_dtype

    out = fake_output(tmp_path / "out", "w")
    safetensors_file(out / "model.safetensors", "F32")
    promote(out, tmp_path / "policy", 0, tmp_path, keep_last=3, dtype="float32")
    version = tmp_path / "policy" / "v0001"
    assert weights_dtype(version) == "float32" and not (version / "fp32").exists()
    assert training_weights(version) == version
    record = json.loads((version / "baton_policy.json").read_text())
    assert (record["dtype"], record["full_precision"]) == ("float32", False)


@pytest.mark.parametrize(
    ("setting", "trained_from", "served", "promoted"),
    [
        ("auto", "bfloat16", "float32", "float32"),  # vLLM on a CPU without native bf16: the trainer's fp32 served
        ("auto", "bfloat16", "bfloat16", "bfloat16"),  # a GPU: the base model's dtype, the fp32 kept beside it
        ("auto", "bfloat16", "float16", "bfloat16"),  # as wide: vLLM casts
        ("auto", "float32", "bfloat16", "float32"),  # an fp32 base stays fp32
        ("auto", "bfloat16", "", "bfloat16"),  # the server's dtype not known (the update run on its own)
        ("auto", None, "float32", None),  # no weights to read: promoted as saved
        ("bfloat16", "bfloat16", "float32", "bfloat16"),  # a named dtype wins
        ("float32", "bfloat16", "bfloat16", "float32"),
    ],
)
def test_auto_promotes_in_the_base_models_dtype_or_the_servers_when_that_is_wider(
    setting: str, trained_from: str | None, served: str, promoted: str | None
) -> None:
    from training.precision import promotion_dtype

    assert promotion_dtype(setting, trained_from, served) == promoted


def test_the_next_update_trains_from_a_versions_fp32_copy_which_goes_with_the_version(tmp_path: Path) -> None:
    from training.precision import training_weights

    root = tmp_path / "policy"
    for i in (1, 2):
        out = fake_output(tmp_path / f"out{i}", f"w{i}")
        (out / "fp32").mkdir()  # what promotion keeps beside bf16 weights (training.precision)
        (out / "fp32" / "config.json").write_text("{}")
        promote(out, root, i, root / "current" if i > 1 else tmp_path, keep_last=1)
    assert training_weights(root / "v0002") == root / "v0002" / "fp32"
    assert promotion.versions(root) == [2] and not (root / "v0001").exists()


def test_a_node_of_a_superseded_run_promotes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, bug 7: after a newer master's start, the older run's promotion writes no version folder and
    leaves `current` alone."""
    root, base, record = tmp_path / "policy", tmp_path / "base", Layout(tmp_path).run_record
    base.mkdir()
    record.parent.mkdir()
    record.write_text(json.dumps({"run_id": "old"}))
    monkeypatch.setenv("BATON_RUN_FENCE", str(record))
    monkeypatch.setenv("BATON_RUN_ID", "old")
    assert promote(fake_output(tmp_path / "out1", "w1"), root, iteration=1, parent_model=base, keep_last=2) == 1
    record.write_text(json.dumps({"run_id": "new"}))
    with pytest.raises(BatonError, match="run old was superseded by run new"):
        promote(fake_output(tmp_path / "out2", "w2"), root, iteration=2, parent_model=root / "current", keep_last=2)
    assert os.readlink(root / "current") == "v0001"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["current", "v0001"]
