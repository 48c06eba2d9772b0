"""Bash's `printf %q`, so that --dry-run prints each command as run.sh always did (one line a shell reads back)."""

from __future__ import annotations

#: the characters bash's sh_backslash_quote escapes wherever they are (lib/sh/shquote.c)
_ALWAYS = set(" \t\n'\"\\|&;()<>!{}*[]?^$`,")


def quote(word: str) -> str:
    if word == "":
        return "''"
    if any(not ch.isprintable() for ch in word):
        body = word.encode("unicode_escape").decode("ascii").replace("'", "\\'")
        return f"$'{body}'"
    out = []
    for i, ch in enumerate(word):
        if ch in _ALWAYS or (ch == "~" and (i == 0 or word[i - 1] in "=:")) or (ch == "#" and i == 0):
            out.append("\\")
        out.append(ch)
    return "".join(out)


def line(label: str, cmd: list[str]) -> str:
    """`[label] word word ...`, each word quoted as %q quotes it."""
    return f"[{label}] " + " ".join(quote(word) for word in cmd)
