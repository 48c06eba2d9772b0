"""Parse a model's free-text reply into one environment action.

Two grammars, both forgiving of what a small instruct model tends to emit and
both returning None for a reply that holds no usable action (the episode loop
counts that as an invalid action):

- `parse_command` (TextWorld): one game command, taken from the first
  non-empty line of the reply, after an optional `command:` / `action:` / `>`
  prefix; quotes, backticks and trailing punctuation are dropped and the text
  is lowercased. A line longer than `max_words` words is not a command.
- `parse_web_action` (MiniWoB++): the first of `click(REF)`, `type(REF, "TEXT")`
  or `answer("TEXT")` in the reply. Variants accepted: upper case, `fill` for
  `type`, brackets or none (`click e4`, `click [e4]`, `click on e4`), `ref=e4`, single,
  double or no quotes, `text=` before the text, and `answer: TEXT`.
  REF is an aria-snapshot element reference such as `e4` or `f1e12`. For a model
  that sees the page as a screenshot, `click(X, Y)` and `type(X, Y, "TEXT")` act
  at a point of it instead (pixels from its top left corner).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PREFIX = re.compile(r"^\s*(?:(?:command|action|next command|cmd)\s*[:=-]\s*|>+\s*)", re.IGNORECASE)
_FENCE = re.compile(r"^```\w*\s*$")
_EDGE = "`\"'*_ \t"
_TRAILING = ".!?;,:"

_REF = r"(?:ref\s*=\s*)?[\[\"']?(?P<ref>(?:f\d+)?e\d+)(?!\w)[\]\"']?"
_TEXT = r"(?:text\s*=\s*)?(?P<text>\"[^\"\n]*\"|'[^'\n]*'|[^)\n]*)"
_OPEN = r"\s*(?:\(\s*|\s+)"
_POINT = r"\s*\(\s*(?P<x>\d{1,5})\s*,\s*(?P<y>\d{1,5})\s*"
_WEB_ACTIONS = [
    re.compile(r"(?<![\w.])(?P<verb>click)" + _POINT + r"\)", re.IGNORECASE),
    re.compile(r"(?<![\w.])(?P<verb>type|fill)" + _POINT + r",\s*" + _TEXT, re.IGNORECASE),
    re.compile(r"(?<![\w.])(?P<verb>click)" + _OPEN + r"(?:on\s+)?" + _REF, re.IGNORECASE),
    re.compile(r"(?<![\w.])(?P<verb>type|fill)" + _OPEN + _REF + r"\s*,?\s*" + _TEXT, re.IGNORECASE),
    re.compile(r"(?<![\w.])(?P<verb>answer)\s*(?:\(\s*|:\s*)" + _TEXT, re.IGNORECASE),
]


@dataclass(frozen=True)
class WebAction:
    """One browser action: `kind` is click, type or answer."""

    kind: str
    ref: str | None = None
    text: str | None = None
    #: (x, y) in the screenshot's pixels, for an action at a point instead of an element
    point: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.ref is not None:
            out["ref"] = self.ref
        if self.point is not None:
            out["point"] = list(self.point)
        if self.text is not None:
            out["text"] = self.text
        return out


def parse_command(reply: str, max_words: int = 12) -> str | None:
    """The TextWorld command in `reply`, or None when there is none."""
    for raw in reply.splitlines():
        if _FENCE.match(raw.strip()):
            continue
        line = _PREFIX.sub("", raw).strip(_EDGE)
        line = _PREFIX.sub("", line).strip(_EDGE).rstrip(_TRAILING).strip(_EDGE)
        if not line:
            continue
        words = line.lower().split()
        return " ".join(words) if len(words) <= max_words else None
    return None


def parse_web_action(reply: str) -> WebAction | None:
    """The first click/type/answer action in `reply`, or None."""
    found: list[tuple[int, WebAction]] = []
    for pattern in _WEB_ACTIONS:
        match = pattern.search(reply)
        if match is not None:
            found.append((match.start(), _web_action(match)))
    return min(found, key=lambda item: item[0])[1] if found else None


def _web_action(match: re.Match[str]) -> WebAction:
    verb = match.group("verb").lower()
    groups = match.groupdict()
    text = groups.get("text")
    if text is not None:
        text = _unquote(text.strip())
    point = (int(groups["x"]), int(groups["y"])) if groups.get("x") is not None else None
    if verb == "click":
        return WebAction("click", ref=groups.get("ref"), point=point)
    if verb in ("type", "fill"):
        return WebAction("type", ref=groups.get("ref"), text=text or "", point=point)
    return WebAction("answer", text=text or "")


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text.strip()
