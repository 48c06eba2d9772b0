"""Extracting a final answer from a model reply.

Rules (`extract_answer(text, rule)`):

- `tag`: the last `<answer>...</answer>` block, else nothing;
- `first_number` / `last_number`: the first / last number in the text;
- `tag_then_first_number` / `tag_then_last_number`: the tag, else that number;
- `text`: the whole reply, stripped.

The default model rarely uses `<answer>` tags, so the `tag_then_*` rules are the
practical defaults for arithmetic. Numbers keep their sign and decimals and
lose thousands separators ("1,024" -> "1024").
"""

from __future__ import annotations

import re

ANSWER_RULES = ("tag", "first_number", "last_number", "tag_then_first_number", "tag_then_last_number", "text")

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-?\d+(?:\.\d+)?")


def tagged_answer(text: str) -> str | None:
    """The content of the last <answer> tag, stripped, or None."""
    found = _TAG.findall(text)
    return found[-1].strip() if found else None


def numbers(text: str) -> list[str]:
    """Every number in the text, in order, without thousands separators."""
    return [m.group(0).replace(",", "") for m in _NUMBER.finditer(text)]


def extract_answer(text: str, rule: str) -> str | None:
    """Apply one of ANSWER_RULES; None when the reply holds no answer under that rule."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"unknown answer rule {rule!r}; expected one of {', '.join(ANSWER_RULES)}")
    if rule == "text":
        return text.strip() or None
    if rule.startswith("tag"):
        tagged = tagged_answer(text)
        if tagged is not None or rule == "tag":
            return tagged
    found = numbers(text)
    if not found:
        return None
    return found[0] if rule.endswith("first_number") else found[-1]
