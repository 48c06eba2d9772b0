"""--dry-run prints each command as bash's `printf %q` would (tests/shell/run_iteration.bats reads them so)."""

from __future__ import annotations

import subprocess

import pytest

from coordinator.driver.shellquote import line, quote

WORDS = [
    "plain",
    "rank_weights=[2,1]",
    "a b",
    "it's",
    'say "hi"',
    "~home",
    "key=~x",
    "#comment",
    "a#b",
    "$HOME",
    "x;y|z&w",
    "",
    "tab\there",
    "new\nline",
    "ünïcode",
    "/abs/path-1.2_3:4@5%6+7",
]


@pytest.mark.parametrize("word", WORDS)
def test_quote_is_bashs_printf_q(word: str) -> None:
    bash = subprocess.run(["bash", "-c", 'printf %q "$1"', "_", word], capture_output=True, text=True, check=True)
    assert quote(word) == bash.stdout


def test_a_quoted_line_reads_back_as_the_same_words() -> None:
    words = ["env", "PYTHONPATH=/r", "python", "-m", "x", "a b", "rank_weights=[2,1]", "it's"]
    printed = line("label", words)
    assert printed.startswith("[label] ")
    back = subprocess.run(
        ["bash", "-c", f'for w in {printed.removeprefix("[label] ")}; do printf "%s\\0" "$w"; done'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert back.stdout.split("\0")[:-1] == words
