"""Write selected samples as a LLaMA-Factory sharegpt dataset.

    files = save_dataset(samples, out_dir, stage="sft", val_split_ratio=0.0, seed=0)

Writes into `out_dir`:

- `train.json` (and `val.json` when `val_split_ratio` > 0): sharegpt rows.
  `conversations` holds the messages that were sent (user -> human,
  assistant -> gpt, tool -> observation) and the sampled reply as the last
  `gpt` turn; the system message goes to `system`; image parts become
  `<image>` placeholders with their paths in `images`. With `mask_history`
  LLaMA-Factory trains only that last turn. KTO rows add `kto_tag`; DPO rows
  end on the human turn and carry `chosen` / `rejected`.
- `dataset_info.json`: `baton_train` (and `baton_val`) with their columns.
- `train.token_ids.jsonl` (and `val.token_ids.jsonl`): per row, the ids the
  policy sampled (`training.fidelity` compares them with LLaMA-Factory's) and
  the log-probabilities it sampled them with, one per reply id
  (`completion_logprobs`; `training.logprob_check` and a policy-gradient loss
  read them); a demonstration's row has none and says `"demonstration": true`.
  With algorithm=grpo each row also has its episode's `"advantage"`, which
  the policy-gradient trainer reads (training.pg_trainer). An episode row
  (training.episodes: `data.episode_rows=auto`, the turns chain) holds every
  turn's ids under `"turns"` instead, in order: the first turn's whole
  `prompt_token_ids`, each later turn's `new_prompt_token_ids` (what the
  conversation adds after the previous reply), and each turn's
  `completion_token_ids` / `completion_logprobs`. `sampled_turns(row)` reads
  both kinds as one list of `SampledTurn`.

`dataset_digest(out_dir, recipe)` is the sha256 of those files and the training
YAML: the master publishes it, and every node checks what it trains on against it.

Pure Python.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.files import read_jsonl, save_json, save_jsonl
from rollout_engine.images import url_path
from rollout_engine.types import Message, logprobs_problem
from training.episodes import RowPlan, plan_rows
from training.selection import Sample

ROLE_TAGS = {"user": "human", "assistant": "gpt", "tool": "observation"}
TRAIN_NAME, VAL_NAME = "baton_train", "baton_val"


@dataclass
class DatasetFiles:
    """What `save_dataset` wrote."""

    directory: Path
    train_rows: int
    val_rows: int
    #: rows are whole episodes (training.episodes): the recipe trains every assistant turn (mask_history false)
    episode_rows: bool = False

    @property
    def names(self) -> tuple[str, str | None]:
        return TRAIN_NAME, (VAL_NAME if self.val_rows else None)


def save_dataset(
    samples: list[Sample] | RowPlan,
    out_dir: str | Path,
    stage: str,
    val_split_ratio: float = 0.0,
    seed: int = 0,
) -> DatasetFiles:
    """Convert, shuffle, split and write the dataset files (each atomically): one row per sample, or the rows
    of a `RowPlan` (training.episodes.plan_rows)."""
    out_dir = Path(out_dir)
    plan = samples if isinstance(samples, RowPlan) else plan_rows(samples, stage, "per_turn")
    rows = [(to_row(turns[-1], stage), row_token_ids(turns)) for turns in plan.rows]
    random.Random(seed).shuffle(rows)
    n_val = int(len(rows) * val_split_ratio)
    splits = {"train": rows[n_val:], "val": rows[:n_val]}
    info: dict[str, Any] = {}
    for split, part in splits.items():
        if not part:
            continue
        save_json(out_dir / f"{split}.json", [row for row, _ in part])
        save_jsonl(out_dir / f"{split}.token_ids.jsonl", [ids for _, ids in part])
        info[TRAIN_NAME if split == "train" else VAL_NAME] = dataset_entry(f"{split}.json", stage)
    save_json(out_dir / "dataset_info.json", info)
    return DatasetFiles(out_dir, len(splits["train"]), len(splits["val"]), plan.episode_rows)


def dataset_digest(directory: Path, recipe: Path) -> str:
    """sha256 over the dataset folder's files (names and bytes, in name order) and the training YAML."""
    digest = hashlib.sha256()
    for path in [*sorted(p for p in directory.rglob("*") if p.is_file()), recipe]:
        name = path.relative_to(directory).as_posix() if path.is_relative_to(directory) else path.name
        digest.update(f"{name}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def load_token_ids(directory: Path, split: str) -> list[Any]:
    """The rows of `<split>.token_ids.jsonl`, one per dataset row.

    Rows match the dataset by position, so a torn line (which read_jsonl skips)
    is an error here: ConfigError naming the file and its lines.
    """
    path = Path(directory) / f"{split}.token_ids.jsonl"
    read = read_jsonl(path)
    if read.torn:
        raise ConfigError(f"{path} has unreadable lines {read.torn}; prepare the data again")
    return read.rows


def drop_rows(files: DatasetFiles, split: str, indices: list[int]) -> None:
    """Remove rows (by index) from one split's dataset and token-id files."""
    doomed = set(indices)
    rows = json.loads((files.directory / f"{split}.json").read_text())
    ids = load_token_ids(files.directory, split)
    save_json(files.directory / f"{split}.json", [r for i, r in enumerate(rows) if i not in doomed])
    save_jsonl(files.directory / f"{split}.token_ids.jsonl", [r for i, r in enumerate(ids) if i not in doomed])
    if split == "train":
        files.train_rows -= len(doomed)
    else:
        files.val_rows -= len(doomed)


def dataset_entry(file_name: str, stage: str) -> dict[str, Any]:
    """One dataset_info.json entry."""
    columns = {"messages": "conversations", "system": "system", "images": "images"}
    if stage == "kto":
        columns["kto_tag"] = "kto_tag"
    if stage == "dpo":
        columns |= {"chosen": "chosen", "rejected": "rejected"}
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "ranking": stage == "dpo",
        "columns": columns,
        "tags": {
            "role_tag": "from",
            "content_tag": "value",
            "user_tag": "human",
            "assistant_tag": "gpt",
            "observation_tag": "observation",
            "system_tag": "system",
        },
    }


def to_row(sample: Sample, stage: str) -> dict[str, Any]:
    """One sharegpt row for `stage`."""
    system, turns, images = convert_messages(sample.messages, sample.source)
    row: dict[str, Any] = {"conversations": turns, "system": system, "images": images}
    if stage == "dpo":
        if sample.rejected is None:
            raise ValueError(f"{sample.source}: a dpo sample needs a rejected reply")
        row["chosen"] = {"from": "gpt", "value": sample.response}
        row["rejected"] = {"from": "gpt", "value": sample.rejected.response}
        return row
    turns.append({"from": "gpt", "value": sample.response})
    if stage == "kto":
        row["kto_tag"] = bool(sample.label)
    return row


def token_ids(sample: Sample) -> dict[str, Any]:
    """The sampled ids and log-probabilities of one row (the fidelity checks', a policy-gradient loss's)."""
    out: dict[str, Any] = {
        "source": sample.source,
        "prompt_token_ids": sample.prompt_token_ids,
        "completion_token_ids": sample.completion_token_ids,
        "completion_logprobs": aligned_logprobs(sample),
    }
    if sample.demonstration:
        out["demonstration"] = True
    if sample.advantage is not None:
        out["advantage"] = sample.advantage
    if sample.rejected is not None:
        out["rejected_source"] = sample.rejected.source
        out["rejected_prompt_token_ids"] = sample.rejected.prompt_token_ids
        out["rejected_completion_token_ids"] = sample.rejected.completion_token_ids
        out["rejected_completion_logprobs"] = aligned_logprobs(sample.rejected)
    return out


def row_token_ids(turns: list[Sample]) -> dict[str, Any]:
    """The sidecar row of one dataset row: one turn's `token_ids`, or an episode row's turns (module doc)."""
    if len(turns) == 1:
        return token_ids(turns[0])
    out: dict[str, Any] = {"source": f"{turns[0].source}..{turns[-1].turn_index}", "turns": []}
    end = 0  # where the previous reply ended in the sequence (the turns chain: training.episodes)
    for turn in turns:
        one = token_ids(turn)
        prompt = one.pop("prompt_token_ids")
        if not out["turns"]:
            one["prompt_token_ids"] = prompt
        else:
            one["new_prompt_token_ids"] = None if prompt is None else prompt[end:]
        end = len(prompt or []) + len(turn.completion_token_ids or [])
        one.pop("advantage", None)
        one.pop("demonstration", None)
        out["turns"].append(one)
    if turns[0].demonstration:
        out["demonstration"] = True
    if turns[0].advantage is not None:
        out["advantage"] = turns[0].advantage
    return out


@dataclass(frozen=True)
class SampledTurn:
    """One reply a dataset row trains, as the policy sampled it (None: not recorded)."""

    source: str
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    completion_logprobs: list[float] | None


def sampled_turns(row: dict[str, Any]) -> list[SampledTurn]:
    """The trained replies of one sidecar row, in order, each with its whole prompt: one for a per-turn row
    (written before episode rows too), every turn of an episode row (its prompts rebuilt from the first
    prompt, the replies and each turn's `new_prompt_token_ids`). A dpo row's rejected reply is not among them."""
    if "turns" not in row:
        return [
            SampledTurn(
                row.get("source", "?"),
                row.get("prompt_token_ids"),
                row.get("completion_token_ids"),
                row.get("completion_logprobs"),
            )
        ]
    out: list[SampledTurn] = []
    sequence: list[int] | None = []
    for turn in row["turns"]:
        added = turn["prompt_token_ids"] if not out else turn.get("new_prompt_token_ids")
        ids = turn.get("completion_token_ids")
        prompt = None if sequence is None or added is None else sequence + added
        out.append(SampledTurn(turn.get("source", "?"), prompt, ids, turn.get("completion_logprobs")))
        sequence = None if prompt is None or ids is None else prompt + ids
    return out


def aligned_logprobs(sample: Sample) -> list[float] | None:
    """`sample.completion_logprobs`, or ConfigError naming the step when they do not align 1:1 with its ids."""
    problem = logprobs_problem(sample.completion_token_ids, sample.completion_logprobs)
    if problem:
        raise ConfigError(f"{sample.source}: {problem}; the journal line is corrupt: move it aside and roll out again")
    return sample.completion_logprobs


def convert_messages(messages: list[Message], source: str) -> tuple[str, list[dict[str, str]], list[str]]:
    """(system, sharegpt turns, image paths) of an OpenAI-style message list."""
    system = ""
    turns: list[dict[str, str]] = []
    images: list[str] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        text, found = _content(message.get("content"), source)
        images.extend(found)
        if role == "system" and position == 0:
            system = text
        elif role in ROLE_TAGS:
            turns.append({"from": ROLE_TAGS[role], "value": text})
        else:
            raise ConfigError(
                f"{source}: message {position} has role {role!r}; sharegpt takes a leading system message, "
                "then user/tool and assistant turns"
            )
    return system, turns, images


def _content(content: Any, source: str) -> tuple[str, list[str]]:
    """Text with `<image>` placeholders, and the image paths, of one message's content."""
    if content is None or isinstance(content, str):
        return content or "", []
    text: list[str] = []
    images: list[str] = []
    for part in content:
        if part.get("type") == "text":
            text.append(part.get("text", ""))
        elif part.get("type") == "image_url":
            url = part["image_url"]["url"] if isinstance(part.get("image_url"), dict) else part.get("image_url")
            if str(url).startswith("data:"):
                raise ConfigError(
                    f"{source}: an inline (data:) image cannot go into a dataset; "
                    "have the environment store screenshots as files"
                )
            images.append(url_path(str(url)) if str(url).startswith("file:") else str(url))
            text.append("<image>")
    return "".join(text), images
