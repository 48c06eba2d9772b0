"""Promote trained weights to `<log>/policy/v<NNNN>/` and flip `policy/current`.

    version = promote(output_dir, policy_root, iteration=3, parent_model=model, keep_last=3)

The model files are gathered in `policy/.staging-v<NNNN>-<pid>/` (hard
links to the training output when on the same filesystem, else copies; a LoRA
adapter is merged first by the caller), a tied output head is written out
(`lm_head.safetensors`, so that vLLM reloads the policy in place exactly:
rollout_engine/checkpoint.py), the optimizer state carried to the next update goes into `optimizer/`
(training.carry), `baton_policy.json` is written, the
staging folder is renamed to `v<NNNN>`, and then `current` is replaced by a
new symlink (made beside it, then `os.replace`), so a reader sees the old
policy or the whole new one. Older versions beyond `keep_last` are deleted
(never the current one). A failure before the flip leaves `current` as it was;
stale staging folders are removed on the next try.

Promotions hold `policy/.promote.lock` (`rollout_engine.files.shared_lock`: flock, which
the Linux NFS client carries to the server as a whole-file POSIX lock), so two can never
race for the same version number or delete each other's staging folder, on one host or several.
Promotion is idempotent per iteration: when a version of the same iteration and
training output already exists (a crash between the promotion and its record),
that version is made current again instead of promoting a copy.

A revert (`run.sh --keep-best`: `revert(...)`) promotes an earlier version's
weights (or the base model's) as the next version the same way; its
`baton_policy.json` names `reverted_to` (the original version, 0 for the base
model) and `why`, its `parent` is the version it replaced. It is idempotent per
iteration too. `policy/best` (a symlink kept by `mark_best`) names the folder
of the best policy measured so far, which pruning keeps like `current`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from rollout_engine.checkpoint import HEAD, HEAD_FILE, missing_tied_head, tensor_files
from rollout_engine.fence import check_fence
from rollout_engine.files import fsync_dir, save_bytes, save_json, shared_lock
from rollout_engine.layout import VERSION as VERSION_DIR
from rollout_engine.layout import staging_name, version_name
from training.carry import OPTIMIZER_FOLDER
from training.precision import FULL_PRECISION, keep_full_precision, weights_dtype

log = logging.getLogger(__name__)

#: files of a training output that a served policy does not need (pickles among them)
DROP = (
    "training_args.bin",
    "trainer_log.jsonl",
    "all_results.json",
    "train_results.json",
    "eval_results.json",
    "trainer_state.json",
    "README.md",
)
#: what a vision-language policy needs to be served besides weights and tokenizer: its processors' settings and
#: chat template (LLaMA-Factory saves the processor it trained with; one missing is taken from the parent model)
SERVING_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class PolicyRecord:
    """`baton_policy.json`."""

    version: int
    iteration: int
    parent: int | None
    parent_path: str
    created_at: float
    source_checkpoint: str
    finetuning_type: str
    optimizer_state: bool
    #: a revert (--keep-best): the original version whose weights this one holds (0: the base model)
    reverted_to: int | None = None
    #: a revert: why, e.g. {"replaced": 4, "replaced_success_rate": 0.125, "best_success_rate": 0.2, ...}
    why: dict | None = None
    #: the served weights' dtype; `fp32/` beside them holds the trainer's full-precision ones (training.precision)
    dtype: str | None = None
    full_precision: bool = False


def versions(policy_root: Path) -> list[int]:
    """Existing version numbers, ascending."""
    if not policy_root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in policy_root.iterdir() if (m := VERSION_DIR.match(p.name)))


def current_version(policy_root: Path) -> int | None:
    """The version `current` points at, if any."""
    return linked_version(policy_root / "current")


def linked_version(link: Path) -> int | None:
    """The version a symlink under policy/ points at, if any."""
    match = VERSION_DIR.match(os.readlink(link)) if link.is_symlink() else None
    return int(match.group(1)) if match else None


def mark_best(policy_root: Path, version: int | None) -> None:
    """Point `policy/best` at version folder `version` (pruning keeps it); None (the base model): remove it."""
    if not policy_root.is_dir():
        return
    with promotion_lock(policy_root):
        if version is None:
            (policy_root / "best").unlink(missing_ok=True)
        elif linked_version(policy_root / "best") != version:
            _flip_link(policy_root, "best", version_name(version))


def parent_version(model: Path) -> int | None:
    """The policy version of the model that was fine-tuned (None for a base model)."""
    record = model / "baton_policy.json"
    if record.exists():
        import json

        return int(json.loads(record.read_text())["version"])
    return None


def promote(
    output_dir: Path,
    policy_root: Path,
    iteration: int,
    parent_model: Path,
    keep_last: int,
    finetuning_type: str = "full",
    carried: Path | None = None,
    dtype: str | None = None,
) -> int:
    """Make `output_dir` the current policy, its weights cast to `dtype` when they are wider (None: as they are;
    the trainer's own kept in fp32/), the optimizer state `carried` (training.carry; a LoRA's is beside its
    adapter, not in the merged `output_dir`) in its optimizer/ when `output_dir` has none; return its version."""
    check_fence(fresh=True)  # before any version folder is written
    policy_root.mkdir(parents=True, exist_ok=True)
    with promotion_lock(policy_root):
        done = promoted_from(policy_root, iteration, output_dir)
        if done is not None:
            if (current_version(policy_root) or 0) < done:
                flip_current(policy_root, version_name(done))
            log.info("iteration %d was already promoted as policy v%04d; not promoting a copy", iteration, done)
            return done
        return _promote_locked(
            output_dir, policy_root, iteration, parent_model, keep_last, finetuning_type, carried, dtype
        )


def promotion_lock(policy_root: Path) -> FileLock:
    """policy/.promote.lock, held while a promotion runs."""
    return shared_lock(policy_root / ".promote.lock")


def promoted_from(policy_root: Path, iteration: int, output_dir: Path) -> int | None:
    """The version already promoted from this iteration's `output_dir`, if any."""
    return _newest_record(policy_root, iteration=iteration, source_checkpoint=str(output_dir))


def _newest_record(policy_root: Path, **fields: object) -> int | None:
    """The newest version whose baton_policy.json has every one of `fields` (unreadable records skipped)."""
    import json

    for version in reversed(versions(policy_root)):
        try:
            data = json.loads((policy_root / version_name(version) / "baton_policy.json").read_text())
        except (FileNotFoundError, ValueError):
            continue
        if all(data.get(key) == value for key, value in fields.items()):
            return version
    return None


def _promote_locked(
    output_dir: Path,
    policy_root: Path,
    iteration: int,
    parent_model: Path,
    keep_last: int,
    finetuning_type: str,
    carried: Path | None,
    dtype: str | None,
) -> int:
    def record(version: int) -> PolicyRecord:
        return PolicyRecord(
            version=version,
            iteration=iteration,
            parent=parent_version(parent_model),
            parent_path=str(parent_model.resolve()),
            created_at=time.time(),
            source_checkpoint=str(output_dir),
            finetuning_type=finetuning_type,
            optimizer_state=False,  # _publish: whether the version holds one
        )

    version = _publish(policy_root, output_dir, record, keep_last, carried=carried, dtype=dtype, parent=parent_model)
    log.info("promoted %s as policy v%04d (current)", output_dir, version)
    return version


def flip_current(policy_root: Path, target: str) -> None:
    """Point `current` at `target` atomically (relative symlink)."""
    _flip_link(policy_root, "current", target)


def _flip_link(policy_root: Path, name: str, target: str) -> None:
    check_fence(fresh=True)  # a node of a superseded run moves no link of the policy (rollout_engine.fence)
    tmp = policy_root / f".{name}-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, policy_root / name)
    fsync_dir(policy_root)


def reverted_from(policy_root: Path, iteration: int, reverted_to: int) -> int | None:
    """The version an earlier revert of this iteration to `reverted_to` promoted, if any."""
    return _newest_record(policy_root, iteration=iteration, reverted_to=reverted_to)


def revert(source: Path, policy_root: Path, iteration: int, reverted_to: int, why: dict, keep_last: int) -> int:
    """Promote the weights of `source` (version `reverted_to`'s folder, or the base model's for 0) as the
    next version, current at once; its parent is the version it replaces (`current`). Returns the version;
    a revert of this iteration to `reverted_to` done before (a resumed run) is made current again instead."""
    check_fence(fresh=True)  # before any version folder is written
    policy_root.mkdir(parents=True, exist_ok=True)
    with promotion_lock(policy_root):
        done = reverted_from(policy_root, iteration, reverted_to)
        if done is not None:
            if (current_version(policy_root) or 0) < done:
                flip_current(policy_root, version_name(done))
            log.info("iteration %d reverted already to v%d as policy v%04d", iteration, reverted_to, done)
            return done

        def record(version: int) -> PolicyRecord:
            return PolicyRecord(
                version=version,
                iteration=iteration,
                parent=current_version(policy_root),
                parent_path=str((policy_root / "current").resolve()) if current_version(policy_root) else "",
                created_at=time.time(),
                source_checkpoint=str(source.resolve()),
                finetuning_type="full",
                optimizer_state=False,
                reverted_to=reverted_to,
                why=why,
            )

        # the source's own record and optimizer state are not this version's
        version = _publish(policy_root, source, record, keep_last, drop_own=True)
    log.info(
        "reverted to %s (%s) as policy v%04d (current)",
        f"v{reverted_to}" if reverted_to else "the base model",
        source,
        version,
    )
    return version


def _publish(
    policy_root: Path,
    source: Path,
    record: Callable[[int], PolicyRecord],
    keep_last: int,
    carried: Path | None = None,
    drop_own: bool = False,
    dtype: str | None = None,
    parent: Path | None = None,
) -> int:
    """Under the promotion lock: stage `source`'s model files as the next version (cast to `dtype` with the
    originals in fp32/, its tied head written, `record(version)` as baton_policy.json, every file readable by
    the other users of a shared path; with `drop_own` the source's own record and optimizer left out), rename
    it into place, flip `current`, prune. Returns the version."""
    _remove_stale_staging(policy_root)
    version = max([0, *versions(policy_root)]) + 1
    staging = policy_root / staging_name(version, os.getpid())
    _gather(source, staging, carried)
    if parent is not None:
        keep_serving_files(staging, parent)
    if drop_own:  # a revert: Adam's moments of later weights are not these weights'
        shutil.rmtree(staging / OPTIMIZER_FOLDER, ignore_errors=True)
        (staging / "baton_policy.json").unlink(missing_ok=True)
    full_precision = keep_full_precision(staging, dtype) if dtype else (staging / FULL_PRECISION).is_dir()
    write_tied_head(staging)
    staged = record(version)
    staged.dtype, staged.full_precision = weights_dtype(staging), full_precision
    staged.optimizer_state = (staging / OPTIMIZER_FOLDER / "state.json").is_file()
    save_json(staging / "baton_policy.json", asdict(staged))
    share(staging)
    final = policy_root / version_name(version)
    os.rename(staging, final)
    fsync_dir(policy_root)
    flip_current(policy_root, final.name)
    prune(policy_root, keep_last)
    return version


def prune(policy_root: Path, keep_last: int) -> list[int]:
    """Delete versions older than the last `keep_last` (never `current`, nor `best`: mark_best)."""
    kept = {current_version(policy_root), linked_version(policy_root / "best")}
    doomed = [v for v in versions(policy_root)[:-keep_last] if v not in kept]
    for version in doomed:
        shutil.rmtree(policy_root / version_name(version))
    return doomed


def write_tied_head(model_dir: Path) -> bool:
    """Write the output head a tied-embedding checkpoint leaves out (`lm_head.weight`: the input embedding,
    in `lm_head.safetensors`, added to the index when there is one). Without it vLLM's CPU backend reloads
    the policy in place under the previous model's head (rollout_engine/checkpoint.py). Transformers ties
    the two again on load, so training from this folder is unchanged. Returns whether it wrote one."""
    embedding = missing_tied_head(model_dir)
    if embedding is None:
        return False
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(tensor_files(model_dir)[embedding]), "pt") as f:
        tensor = f.get_tensor(embedding)
    save_bytes(model_dir / HEAD_FILE, save({HEAD: tensor.contiguous()}, metadata={"format": "pt"}))
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():  # replaced, not edited: the staged index is a hard link to the training output's
        import json

        data = json.loads(index.read_text())
        data["weight_map"][HEAD] = HEAD_FILE
        save_json(index, data)
    return True


def keep_serving_files(staging: Path, parent: Path) -> list[str]:
    """Copy into `staging` the SERVING_FILES `parent` (the model trained from) has and the training output lacks,
    so that a vision-language policy serves as its parent did; returns their names."""
    copied = [name for name in SERVING_FILES if (parent / name).is_file() and not (staging / name).exists()]
    for name in copied:
        shutil.copy2(parent / name, staging / name)
    return copied


def _gather(output_dir: Path, staging: Path, carried: Path | None) -> None:
    """Link (or copy) the model files into `staging`, and the optimizer state `carried` into staging/optimizer
    when the output has none."""
    _link_tree(output_dir, staging)
    if carried is not None and carried.is_dir() and not (staging / OPTIMIZER_FOLDER).exists():
        _link_tree(carried, staging / OPTIMIZER_FOLDER)
    for path in staging.glob("checkpoint-*"):
        shutil.rmtree(path)
    for name in DROP:
        (staging / name).unlink(missing_ok=True)


def _link_tree(source: Path, target: Path) -> None:
    """`source` copied as `target`: hard links (instant, and the training output stays intact for a retry), or
    copies where the filesystem has none."""
    try:
        shutil.copytree(source, target, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


def share(folder: Path) -> None:
    """Make every file readable and every folder listable by the other users of a shared log path, as every
    file rollout_engine.files writes is (0644): a trainer may save its weights 0600."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_file() and not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o644)
        elif path.is_dir() and not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o755)


def _remove_stale_staging(policy_root: Path) -> None:
    for path in policy_root.glob(".staging-v*"):
        log.warning("removing %s left by an earlier failed promotion", path)
        shutil.rmtree(path, ignore_errors=True)
