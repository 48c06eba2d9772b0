"""run.sh's voice: `[baton] ...` lines on stderr, and the exceptions that end a run.

A phase that must end the run raises `Die(code, message)`; `run.main` prints
`[baton] error: <message>` and exits with `code` after the clean-up. `BadInput` is exit 2
with a pointer to --help (the command line's rules). `Ended` ends the run with a code and
no error line (a stop: 143; the master's end of the run seen by a worker: 0).
"""

from __future__ import annotations

import sys


def log(message: str) -> None:
    print(f"[baton] {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"[baton] warning: {message}", file=sys.stderr, flush=True)


class Ended(Exception):
    """End the run with exit `code`; `message`, when given, is logged as a plain line first."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Die(Ended):
    """End the run with exit `code` and `[baton] error: <message>`."""


class BadInput(Die):
    """Bad input on the command line or in the environment: exit 2, the message and a pointer to --help."""

    def __init__(self, message: str) -> None:
        super().__init__(2, message)


def error_lines(exc: Ended) -> list[str]:
    """The lines `run.main` prints for `exc` (run.sh's wording: an error line, with a pointer to --help for
    bad input, or a plain line)."""
    if isinstance(exc, BadInput):
        return [f"[baton] error: {exc.message}", "[baton] see: bash scripts/run.sh --help"]
    if isinstance(exc, Die):
        return [f"[baton] error: {exc.message}"]
    return [f"[baton] {exc.message}"] if exc.message else []
