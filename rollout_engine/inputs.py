"""The one rule for JSON-lines files a user hands Baton: task files and demonstrations.

    data = read_input(path, "task file", "point it at a readable JSONL task file")   # ConfigError if unreadable
    for number, text in input_lines(data, f"task file {path}", "one JSON task per line, docs/formats.md"):
        row = json.loads(text)                                                        # (ConfigError: file:line)

Unlike a journal Baton writes itself (rollout_engine.files: a torn line is a crash's and is skipped),
an input file is taken whole or refused: UTF-8 text (a BOM allowed on the first line), no line over
`MAX_LINE_BYTES`; blank lines are skipped.
"""

from __future__ import annotations

from pathlib import Path

from rollout_engine.errors import ConfigError

#: an input line's limit: no model's context holds a prompt this large, and a line this large is a file
#: written wrong (a page dump, a missing newline) far more often than a task
MAX_LINE_BYTES = 16 * 2**20


def input_lines(data: bytes, where: str, form: str) -> list[tuple[int, str]]:
    """The non-blank lines of `data` (from the file `where` names) with their 1-based numbers; a line that is not
    UTF-8 or over the limit is a ConfigError naming `<where>:<n>` and the fix (`form`: the file's format, where
    it is described)."""
    lines = []
    for number, raw in enumerate(data.splitlines(), start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise ConfigError(
                f"{where}:{number} is {len(raw) / 2**20:.1f} MiB, over the {MAX_LINE_BYTES // 2**20} MiB a line may "
                f"hold; move large content into files the line names ({form})"
            )
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where}:{number} is not UTF-8 text ({exc.reason} at byte {exc.start + 1} of that line); "
                f"save it as UTF-8 (e.g. iconv -f latin1 -t utf-8; {form})"
            ) from None
        if text.strip():
            lines.append((number, text))
    return lines


def read_input(path: Path, what: str, fix: str) -> bytes:
    """The bytes of the input file `path` (`what` names it in the error: "task file", ...)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read (got {str(path)!r}: {exc.strerror or exc}); {fix}") from None
