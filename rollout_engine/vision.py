"""Vision-language models Baton serves and trains: the families it knows, found from a model's config.json.

    family = vision_family(config)      # None for a text model; VisionFamily for Qwen2/2.5/3-VL
    family.plugin                       # "Qwen3VLPlugin": the LLaMA-Factory multimodal plugin its rows need
    vision_problem(config, where)       # "" or why this vision-language model is refused (bad input)
    image_pixels(model_dir)             # (65536, 16777216): the min/max pixels vLLM's processor resizes to

A model is vision-language when its config.json has a `vision_config`. Baton sends it images and trains it on
rows with images only where the whole way is known: vLLM serves the family, LLaMA-Factory has a multimodal
plugin that expands an image into the same tokens vLLM's processor does (the token-fidelity check, docs/update.md),
and the image processor's resolution settings can be made to agree (min/max pixels). The Qwen-VL families share
one image processor (Qwen2VLImageProcessor: patches merged 2 x 2, `min_pixels`/`max_pixels`); Qwen3-VL is the
one tested end to end here (tests/e2e/toy_vlm.py). Other families (LLaVA, Gemma 3, InternVL, ...) are refused
naming these. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VisionFamily:
    """A vision-language family: its config.json model types and LLaMA-Factory's multimodal plugin for it."""

    name: str
    model_types: tuple[str, ...]
    #: the class name of LLaMA-Factory's mm_plugin whose templates can train it
    plugin: str


FAMILIES = (
    VisionFamily("Qwen3-VL", ("qwen3_vl", "qwen3_vl_moe"), "Qwen3VLPlugin"),
    VisionFamily("Qwen2-VL / Qwen2.5-VL", ("qwen2_vl", "qwen2_5_vl"), "Qwen2VLPlugin"),
)


def is_vision_language(config: object) -> bool:
    return isinstance(config, dict) and config.get("vision_config") is not None


def vision_family(config: object) -> VisionFamily | None:
    """The family of a vision-language config.json (None for a text model or an unknown family)."""
    if not is_vision_language(config):
        return None
    assert isinstance(config, dict)
    kind = str(config.get("model_type", ""))
    return next((f for f in FAMILIES if kind in f.model_types), None)


def vision_problem(config: object, where: str) -> str:
    """Why the vision-language model of `config` (its config.json, at `where`) cannot be served and trained ("" when
    it can, or when it is a text model)."""
    if not is_vision_language(config) or vision_family(config) is not None:
        return ""
    assert isinstance(config, dict)
    known = "; ".join(f"{f.name} (model_type {', '.join(f.model_types)})" for f in FAMILIES)
    return (
        f"{where} is a vision-language model of a family Baton does not send images to yet "
        f"(model_type {config.get('model_type', '?')!r}); use a text model, or one of {known}"
    )


#: where a model folder keeps its image processor's settings: the file, and the key holding them ("" = the top)
PROCESSOR_FILES = (("preprocessor_config.json", ""), ("processor_config.json", "image_processor"))


def image_pixels(model: Path) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) of the model's image processor as vLLM's processor reads them (Qwen-VL's
    Qwen2VLImageProcessor: `size.shortest_edge`/`size.longest_edge`, or older folders' `min_pixels`/`max_pixels`);
    None when the folder says neither. LLaMA-Factory resizes with its own image_min_pixels/image_max_pixels
    (defaults 1,024 and 589,824): set to these, an image expands to the same tokens in both."""
    for name, key in PROCESSOR_FILES:
        try:
            data = json.loads((model / name).read_text())
        except (OSError, ValueError):
            continue
        settings = data.get(key) if key and isinstance(data, dict) else data
        if not isinstance(settings, dict):
            continue
        size = settings.get("size") if isinstance(settings.get("size"), dict) else {}
        low = size.get("shortest_edge", settings.get("min_pixels"))
        high = size.get("longest_edge", settings.get("max_pixels"))
        if isinstance(low, int) and isinstance(high, int):
            return low, high
    return None
