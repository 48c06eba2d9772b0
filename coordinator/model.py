"""The run's model: found from `model_config`, checked before anything starts, pinned in the run.

    found = find_model(data_path, model_config)       # Found(path=..., source="folder" | "hub cache" | ...)
    problems = model_problems(found.path)             # [] or what makes the folder unusable (bad input)
    record = model_record(found, model_config, max_model_len)
    mismatch(load_model_record(log_path), record)     # "" or why this node may not serve/train its model

`model_config.model` is a Hugging Face model folder (absolute, or relative to the data path) or a Hub id
(`Qwen/Qwen3-8B`), looked up in the Hugging Face caches — the data path's `<data>/.cache/huggingface/hub`
first, then this host's (`$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`) — and, when no cache
holds it, downloaded into the data path's cache by the train environment's huggingface_hub (where there is a
network). "" is the shipped model, `<data>/models/SmolLM2-135M-Instruct`; `model_config.model_type` names
the reference's (qwen3-instruct, qwen3-think).

The first start of a log path records what it serves and trains in `<log>/model.json` (Layout.model):
the model asked for, the folder found, a digest of its config and tokenizer files (the same model reached
through another path or cache agrees), the chat template arguments, the reasoning format and the served
context length. Every later start — a worker joining, `--resume`, a run on the same log path — must
agree, or it is refused (exit 2) naming both. Standard library only (the app environment).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_engine.config import ModelConfig
from rollout_engine.defaults import MODEL_DOWNLOAD_S
from rollout_engine.files import save_json
from rollout_engine.layout import Layout
from rollout_engine.vision import vision_problem

#: the model run.sh serves and trains when model_config names none (scripts/prepare.sh makes it)
SHIPPED = "models/SmolLM2-135M-Instruct"
#: the Hugging Face cache on the data path (the reference exports HF_HOME there too)
DATA_CACHE = ".cache/huggingface/hub"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
#: files whose bytes make a model's identity: what it computes and how it reads and writes text
IDENTITY_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
#: settings every node and every later start must share
PINNED = ("identity", "chat_template_kwargs", "reasoning", "max_model_len")


class ModelNotFound(ValueError):
    """model_config names no model this node can reach; the message says what to do."""


@dataclass(frozen=True)
class Found:
    """Where the model asked for is on this node."""

    #: what was asked for ("" = the shipped model)
    wanted: str
    path: Path
    #: folder, hub cache, shipped, or download (not there yet: `download` fetches it)
    source: str
    cache: Path | None = None


def hub_caches(data_path: str | Path, env: dict[str, str] | os._Environ = os.environ) -> list[Path]:
    """The Hugging Face hub caches searched, the data path's first."""
    home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    ordered = [Path(data_path) / DATA_CACHE, Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else home / "hub"]
    return list(dict.fromkeys(ordered))


def cached_snapshot(cache: Path, repo_id: str) -> Path | None:
    """The snapshot folder of `repo_id`'s main revision in hub cache `cache` (with its config.json), or None."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        snapshots = sorted((repo / "snapshots").glob("*/config.json")) if (repo / "snapshots").is_dir() else []
        return snapshots[-1].parent if len(snapshots) == 1 else None
    snapshot = repo / "snapshots" / revision
    return snapshot if (snapshot / "config.json").is_file() else None


def find_model(data_path: str | Path, cfg: ModelConfig) -> Found:
    """Where model_config's model is on this node; ModelNotFound when nowhere it could be."""
    wanted = cfg.wanted
    if not wanted:
        return Found("", Path(data_path) / SHIPPED, "shipped")
    key = "model_config.model" if cfg.model else "model_config.model_type"
    folder = Path(wanted) if Path(wanted).is_absolute() else Path(data_path) / wanted
    if folder.is_dir():
        return Found(wanted, folder, "folder")
    if Path(wanted).is_absolute() or not HUB_ID.fullmatch(wanted):
        raise ModelNotFound(
            f"{key}={wanted!r} is not a folder (looked for {folder}) nor a Hugging Face Hub id (org/name); "
            "give a model folder (absolute, or relative to --data-path) or a Hub id such as Qwen/Qwen3-8B"
        )
    caches = hub_caches(data_path)
    for cache in caches:
        if (snapshot := cached_snapshot(cache, wanted)) is not None:
            return Found(wanted, snapshot, "hub cache", cache)
    return Found(wanted, caches[0], "download", caches[0])


def download(found: Found, data_path: str | Path, train_py: str, env: dict[str, str]) -> Found:
    """Fetch a Hub model into the data path's cache with the train environment's huggingface_hub; ModelNotFound
    (with the way to get it there by hand) when that fails, e.g. on a node without a network."""
    assert found.cache is not None
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2]))"
    )
    limit = MODEL_DOWNLOAD_S.value()
    try:
        done = subprocess.run(
            [train_py, "-c", code, found.wanted, str(found.cache)],
            capture_output=True,
            text=True,
            env={**env, "HF_HUB_DISABLE_TELEMETRY": "1"},
            timeout=limit,
            check=False,
        )
        why = (done.stderr.strip().splitlines() or ["no output"])[-1] if done.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    snapshot = cached_snapshot(found.cache, found.wanted)
    if why or snapshot is None:
        raise ModelNotFound(
            f"model_config.model={found.wanted!r} is in no Hugging Face cache here "
            f"({', '.join(map(str, hub_caches(data_path)))}) and downloading it failed "
            f"({why or 'no snapshot with a config.json'}); on a machine with a network run "
            f"`huggingface-cli download {found.wanted} --cache-dir {found.cache}` (or give a model folder)"
        )
    return Found(found.wanted, snapshot, "download", found.cache)


def chat_template_text(model: Path) -> str | None:
    """The model's chat template as its files hold it (tokenizer_config.json, chat_template.jinja/.json)."""
    if (model / "chat_template.jinja").is_file():
        return (model / "chat_template.jinja").read_text(errors="replace")
    for name, key in (("chat_template.json", "chat_template"), ("tokenizer_config.json", "chat_template")):
        try:
            value = json.loads((model / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, list):  # named templates: [{"name": "default", "template": "..."}]
            value = "\n".join(str(t.get("template", "")) for t in value if isinstance(t, dict))
        if isinstance(value, str) and value.strip():
            return value
    return None


def model_problems(model: Path, key: str = "model_config.model") -> list[str]:
    """What makes the folder unusable before anything starts (the update-check then loads the tokenizer and
    finds the training template: training.chat_template)."""
    try:
        config = json.loads((model / "config.json").read_text())
    except OSError:
        return [
            f"{key}: {model} holds no config.json; give a Hugging Face model folder (config.json, weights, tokenizer)"
        ]
    except ValueError as exc:
        return [f"{key}: {model}/config.json is not JSON ({exc}); give a Hugging Face model folder"]
    problems = []
    if vision := vision_problem(config, f"{key}: {model}"):
        problems.append(vision)
    if not any((model / name).is_file() for name in TOKENIZER_FILES) and not list(model.glob("*.tiktoken")):
        problems.append(
            f"{key}: {model} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); give {key} a folder "
            "with the model's tokenizer files (copy them in from where the model came from)"
        )
    elif chat_template_text(model) is None:
        problems.append(
            f"{key}: {model} has no chat template (tokenizer_config.json's chat_template, chat_template.jinja); "
            "use the instruct or chat variant of the model, or add its chat template to the folder"
        )
    return problems


def reasoning_of(model: Path, setting: str) -> str:
    """model_config.reasoning resolved: think when auto and the chat template knows `</think>`."""
    if setting != "auto":
        return setting
    return "think" if "</think>" in (chat_template_text(model) or "") else "none"


def identity(model: Path) -> str:
    """sha256 over the model's config and tokenizer files (names and bytes): the same model, wherever it is."""
    digest = hashlib.sha256()
    for name in IDENTITY_FILES:
        path = model / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def model_record(found: Found, cfg: ModelConfig, max_model_len: int | None) -> dict[str, Any]:
    """What `<log>/model.json` holds for this node's model (`max_model_len` None: this start serves nothing,
    an update-only run or --debug-mode, so it has no context to compare)."""
    return {
        "wanted": found.wanted or "(the shipped model)",
        "path": str(found.path),
        "source": found.source,
        "identity": identity(found.path),
        "chat_template_kwargs": dict(cfg.chat_template_kwargs),
        "reasoning": reasoning_of(found.path, cfg.reasoning),
        "max_model_len": max_model_len,
        "time": time.time(),
    }


def load_model_record(log_path: str | Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Layout(log_path).model.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mismatch(pinned: dict[str, Any] | None, mine: dict[str, Any], log_path: str | Path) -> str:
    """Why this node may not serve and train its model on this log path ("" when it agrees)."""
    if pinned is None:
        return ""
    differ = [key for key in PINNED if pinned.get(key) is not None and mine.get(key) is not None]
    differ = [key for key in differ if pinned[key] != mine[key]]
    if not differ:
        return ""

    def said(record: dict[str, Any]) -> str:
        shown = [f"{record['wanted']} ({record['path']})"]
        shown += [f"{k} {record[k]}" for k in differ if k != "identity"]
        return ", ".join(shown)

    what = "model" if "identity" in differ else "model settings"
    return (
        f"this node would serve and train {said(mine)}, but this log path's {what} is {said(pinned)} "
        f"({Layout(log_path).model}); start every node, and every --resume, with the same model_config "
        "(and vllm_config.max_model_len), or use a new --log-path"
    )


def save_model_record(log_path: str | Path, record: dict[str, Any]) -> None:
    save_json(Layout(log_path).model, record)
