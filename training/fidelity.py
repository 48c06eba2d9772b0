"""Token fidelity: LLaMA-Factory trains on exactly the ids the policy sampled.

    report = check_fidelity(recipe, samples=64, seed=0)       # train environment
    python -m training.fidelity <train_config.yaml> [--samples N]

Loads the dataset of a generated LLaMA-Factory YAML with LLaMA-Factory's own
argument parser, loader, tokenizer and template, encodes sampled rows the way
its processors do (for sft through `SupervisedDatasetProcessor`, so
`mask_history` and `cutoff_len` count), and compares with the ids vLLM
reported (`<split>.token_ids.jsonl`): the prompt ids must be equal, and the
trained reply ids must be the sampled ids followed only by end-of-turn tokens
the sampler did not emit (ChatML's `<|im_end|>\\n` after a reply that stopped
on `<|im_end|>` adds `\\n`). An episode row (training.episodes) is compared
turn by turn: each trained turn's prompt (everything before its reply, the
earlier turns included) and reply against that turn's sampled ids. A mismatch raises `ConfigError` with the row, the
first differing position and both decoded contexts. Rows without stored ids
are skipped and counted: demonstration rows (nothing was sampled) apart from
the others.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from training.alignment import compare, split_turns
from training.dataset import load_token_ids, sampled_turns
from training.recipe import load_template, parse_recipe

log = logging.getLogger(__name__)
CONTEXT = 24  # tokens of decoded context shown on each side of a mismatch


@dataclass
class FidelityReport:
    """How many rows were compared, and how many had no stored ids."""

    rows: int
    checked: int
    without_ids: int
    #: demonstration rows (data.demonstrations): no sampled ids, so nothing to compare
    demonstrations: int = 0
    #: rows whose reply LLaMA-Factory would tokenize differently from the sampled ids (same text)
    noncanonical: list[int] = field(default_factory=list)


@dataclass
class _Encoder:
    tokenizer: Any
    template: Any
    processor: Any  # SupervisedDatasetProcessor, for sft
    stage: str
    #: the model's Hugging Face processor (images), None for a text model
    mm_processor: Any = None

    def encode(self, row: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, trained reply ids) per checked reply of one aligned row."""
        prompt, response, system, tools = row["_prompt"], row["_response"], row["_system"], row["_tools"]
        images = row.get("_images") or []
        if not prompt or not response:
            return [([], [])]  # LLaMA-Factory dropped the row as malformed
        if self.stage == "sft":
            input_ids, labels = self.processor._encode_data_example(prompt, response, system, tools, images, [], [])
            return split_turns(input_ids, labels) or [(input_ids, [])]
        replies = response
        if self.stage == "kto":  # LLaMA-Factory pads a kto reply with an empty message on the other side
            replies = [r for r in response if r["content"]] or response[:1]
        return [self._oneturn([*prompt, reply], system, tools, images) for reply in replies]

    def _oneturn(self, messages: list[Any], system: Any, tools: Any, images: list[Any]) -> tuple[list[int], list[int]]:
        """A kto/dpo row's (prompt ids, reply ids), its images expanded as LLaMA-Factory's processors do."""
        plugin = self.template.mm_plugin
        messages = plugin.process_messages(messages, images, [], [], self.mm_processor)
        prompt, reply = self.template.encode_oneturn(self.tokenizer, messages, system, tools)
        prompt, _ = plugin.process_token_ids(prompt, None, images, [], [], self.tokenizer, self.mm_processor)
        return prompt, reply

    def image_token(self) -> int | None:
        """The id an image expands into (Qwen-VL: <|image_pad|>), None for a text model."""
        token = getattr(self.template.mm_plugin, "image_token", None)
        return None if token is None or self.mm_processor is None else self.tokenizer.convert_tokens_to_ids(token)

    def end_of_turn(self) -> list[int]:
        return self.template._convert_elements_to_ids(self.tokenizer, self.template.format_assistant.apply(content=""))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def decode_text(self, ids: list[int]) -> str:
        """The text a server returns for `ids` (special tokens skipped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def check_fidelity(recipe: dict[str, Any], samples: int, seed: int = 0, split: str = "train") -> FidelityReport:
    """Compare `samples` rows (-1 = all) of one split; raise ConfigError on a mismatch.

    A reply that decodes to the same text but that LLaMA-Factory tokenizes
    differently (the sampler picked a non-canonical split, e.g. ' grad'+'it'
    for ' gradit') is not a template problem: its row index is reported in
    `noncanonical` for the caller to drop.
    """
    name = "baton_train" if split == "train" else "baton_val"
    encoder, rows = _load(recipe, name)
    sidecar = Path(recipe["dataset_dir"]) / f"{split}.token_ids.jsonl"
    sampled = load_token_ids(Path(recipe["dataset_dir"]), split)
    if len(sampled) != len(rows):
        raise ConfigError(f"{sidecar} has {len(sampled)} rows but the dataset {len(rows)}; prepare the data again")
    picks = (
        range(len(rows))
        if samples < 0
        else sorted(random.Random(seed).sample(range(len(rows)), min(samples, len(rows))))
    )
    report = FidelityReport(rows=len(rows), checked=0, without_ids=0)
    eot = encoder.end_of_turn()
    for index in picks:
        ids = sampled[index]
        expected = _expected(ids)
        if any(p is None or c is None for p, c in expected):
            if ids.get("demonstration"):
                report.demonstrations += 1
            else:
                report.without_ids += 1
            continue
        encoded = encoder.encode(rows[index])
        if len(expected) == 1:  # a per-turn row: its reply is the last turn (algorithm.mask_history false trains more)
            encoded = encoded[-1:]
        if len(encoded) != len(expected):
            raise ConfigError(
                f"token fidelity: dataset row {index} ({ids.get('source')}) holds {len(expected)} sampled replies "
                f"but LLaMA-Factory trains {len(encoded)} turns of it (mask_history "
                f"{recipe.get('mask_history')}, cutoff_len {recipe.get('cutoff_len')}): an episode row needs "
                "mask_history false and the whole episode within cutoff_len; prepare the data again, or set "
                "data.episode_rows=per_turn"
            )
        for (prompt, reply), (got_prompt, got_reply) in zip(expected, encoded, strict=True):
            position = compare(prompt, reply, got_prompt, got_reply, eot)
            if position is None:
                continue
            if _same_text(prompt, reply, got_prompt, got_reply, eot, encoder):
                report.noncanonical.append(index)
                break
            raise ConfigError(
                describe(position, index, ids["source"], prompt + reply, got_prompt + got_reply, encoder, recipe)
            )
        report.checked += 1
    if report.demonstrations:
        log.info("token fidelity: skipped %d demonstration rows: no sampled token ids", report.demonstrations)
    if report.without_ids:
        log.warning(
            "token fidelity: %d of %d rows have no stored token ids (not checked)", report.without_ids, len(picks)
        )
    log.info(
        "token fidelity (%s, template %s): %d rows checked, %d re-tokenize differently (same text)",
        split,
        recipe["template"],
        report.checked,
        len(report.noncanonical),
    )
    return report


def _same_text(
    prompt: list[int],
    reply: list[int],
    got_prompt: list[int],
    got_reply: list[int],
    end_of_turn: list[int],
    encoder: _Encoder,
) -> bool:
    """Same prompt ids, and a reply that differs only in how the same text was split into tokens.

    Two more cases the reply's text cannot give back: a reply cut at max_new_tokens inside a multi-byte
    character ends in byte tokens that decode to U+FFFD, and special tokens the policy sampled inside its
    reply (e.g. <|im_start|>) are not in the text the server returned."""
    if prompt != got_prompt:
        return False
    want, got, eot = encoder.decode(reply).rstrip("\ufffd"), encoder.decode(got_reply), encoder.decode(end_of_turn)
    if got.startswith(want) and eot.endswith(got[len(want) :]):
        return True
    return encoder.decode_text(reply).rstrip("\ufffd").strip() == encoder.decode_text(got_reply).strip()


def _expected(ids: dict[str, Any]) -> list[tuple[list[int] | None, list[int] | None]]:
    """(prompt ids, reply ids) of each reply the row trains, as sampled (a dpo row: chosen, then rejected)."""
    out = [(turn.prompt_token_ids, turn.completion_token_ids) for turn in sampled_turns(ids)]
    if "rejected_completion_token_ids" in ids:
        out.append((ids["rejected_prompt_token_ids"], ids["rejected_completion_token_ids"]))
    return out


def describe(
    position: int, index: int, source: str, want: list[int], got: list[int], encoder: _Encoder, recipe: dict[str, Any]
) -> str:
    """The mismatch message: where, which ids, both decoded contexts, and what to change."""
    lo, hi = max(0, position - CONTEXT), position + CONTEXT

    def show(ids: list[int]) -> str:
        here = ids[position] if position < len(ids) else "end"
        return f"id {here}; context {encoder.decode(ids[lo:position])!r} >>> {encoder.decode(ids[position:hi])!r}"

    head = (
        f"token fidelity: dataset row {index} ({source}) differs from the sampled ids at position {position}\n"
        f"  sampled by the policy: {show(want)}\n"
        f"  LLaMA-Factory trains:  {show(got)}\n"
    )
    image = encoder.image_token()
    if image is not None and image in (want[position : position + 1] + got[position : position + 1]):
        return head + (
            f"  an image expands to {_run(want, position, image)} tokens in vLLM's prompt and "
            f"{_run(got, position, image)} in LLaMA-Factory's: image_min_pixels {recipe.get('image_min_pixels')} "
            f"and image_max_pixels {recipe.get('image_max_pixels')} must be the model's image processor's "
            "(preprocessor_config.json size.shortest_edge/longest_edge, what vLLM resizes to): drop "
            "algorithm.llamafactory_overrides.image_min_pixels/image_max_pixels, or serve with the same "
            "settings (docs/update.md)"
        )
    return head + (
        f"  template {recipe['template']!r}, default_system {recipe.get('default_system')!r}: set "
        "model_config.template=auto and model_config.default_system=auto to use those that render the model's "
        "chat template token for token (docs/models.md)"
    )


def _run(ids: list[int], position: int, token: int) -> int:
    """The length of the run of `token` around `position` (an image's pad tokens)."""
    start = position
    while start > 0 and ids[start - 1] == token:
        start -= 1
    end = start
    while end < len(ids) and ids[end] == token:
        end += 1
    return end - start


def _load(recipe: dict[str, Any], name: str) -> tuple[_Encoder, list[dict[str, Any]]]:
    """LLaMA-Factory's tokenizer, template and the aligned (not yet tokenized) dataset `name`."""
    from llamafactory.data.loader import _get_merged_dataset
    from llamafactory.data.processor import SupervisedDatasetProcessor

    args = parse_recipe(recipe)
    tokenizer_module, template = load_template(args)
    tokenizer = tokenizer_module["tokenizer"]
    stage = args.finetuning.stage
    # LLaMA-Factory's dpo workflow loads its pairwise data as stage "rm"
    dataset = _get_merged_dataset([name], args.model, args.data, args.training, "rm" if stage == "dpo" else stage)
    processor = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=tokenizer_module["processor"], data_args=args.data
    )
    return _Encoder(tokenizer, template, processor, stage, tokenizer_module["processor"]), list(dataset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, help="a train_config.yaml written by python -m training")
    parser.add_argument("--samples", type=int, default=-1, help="rows to check (-1 = all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from omegaconf import OmegaConf

    recipe = OmegaConf.to_container(OmegaConf.load(args.recipe))
    try:
        report = check_fidelity(recipe, args.samples, args.seed)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
