"""Images in the chat the episode loop sends: observations as content parts, and a history that keeps few.

    content(Observation("Page: ...", ("images/ep#0/step_001.png",)), root)
    # [{"type": "image_url", "image_url": {"url": "file:///log/trajectories/train/iter_0001/images/ep%230/..."}},
    #  {"type": "text", "text": "Page: ..."}]
    keep_newest_images(messages, 2)     # older image parts replaced by a text STUB

Images go to vLLM by `file://` URL of the file the environment wrote under the log path (vLLM's
`--allowed-local-media-path` is the log path: vllm_config.allowed_local_media_path auto), so nothing is copied into
the requests; the URL is the path percent-encoded (`#` in an episode id would end a URL's path). Each screenshot
costs the prompt hundreds of tokens (1,000 for 1280x800 on Qwen3-VL) and vLLM refuses a prompt with more images than
`--limit-mm-per-prompt` allows (HTTP 400), so the loop keeps only the newest ones: `images_per_prompt` says how many.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from rollout_engine.types import Message, Observation

#: what stands in the history for an image left out
STUB = "[an earlier screenshot, left out]"
#: images per prompt when vllm_config.limit_mm_per_prompt does not say (the newest observation's screenshot)
DEFAULT_IMAGES_PER_PROMPT = 1


@dataclass(frozen=True)
class MediaSettings:
    """How one rollout sends images: the directory their paths are relative to (the iteration directory: files
    under the log path, which vLLM may read) and how many one prompt keeps."""

    root: Path | None = None
    per_prompt: int = DEFAULT_IMAGES_PER_PROMPT


def images_per_prompt(limit_mm_per_prompt: Mapping[str, int]) -> int:
    """The images one prompt keeps: vllm_config.limit_mm_per_prompt.image, else DEFAULT_IMAGES_PER_PROMPT."""
    limit = limit_mm_per_prompt.get("image")
    return DEFAULT_IMAGES_PER_PROMPT if limit is None else int(limit)


def file_url(path: Path) -> str:
    return path.resolve().as_uri()


def url_path(url: str) -> str:
    """The file a `file://` URL names (its percent-encoding undone)."""
    return url2pathname(urlparse(url).path)


def content(observation: Observation, root: Path | None) -> str | list[dict[str, Any]]:
    """A message's content for `observation`: its images (files under `root`), then its text; plain text when it
    has no image."""
    if not observation.images:
        return observation.text
    if root is None:
        raise ValueError("an observation with images needs the directory its paths are relative to")
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": file_url(root / image)}} for image in observation.images
    ]
    return [*parts, {"type": "text", "text": observation.text}]


def as_message(message: Message, root: Path | None) -> Message:
    """`message` with an Observation content turned into content parts."""
    if isinstance(message.get("content"), Observation):
        return {**message, "content": content(message["content"], root)}
    return message


def is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def count_images(messages: list[Message]) -> int:
    return sum(is_image(p) for m in messages if isinstance(m.get("content"), list) for p in m["content"])


def keep_newest_images(messages: list[Message], limit: int) -> list[Message]:
    """`messages` with at most `limit` images, the newest: each older image part becomes a text part STUB."""
    drop = count_images(messages) - max(0, limit)
    if drop <= 0:
        return messages
    out: list[Message] = []
    for message in messages:
        parts = message.get("content")
        if not isinstance(parts, list) or drop <= 0:
            out.append(message)
            continue
        kept = []
        for part in parts:
            if is_image(part) and drop > 0:
                drop -= 1
                part = {"type": "text", "text": STUB + "\n"}
            kept.append(part)
        out.append({**message, "content": kept})
    return out
