"""The split of a thinking model's reply into reasoning and answer (rollout_engine.reasoning)."""

from __future__ import annotations

import pytest

from rollout_engine.reasoning import SplitReply, split_reply


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # no tags: the whole reply is the answer
        ("click(e5)", SplitReply("", "click(e5)")),
        ("", SplitReply("", "")),
        ("  go east\n", SplitReply("", "  go east\n")),
        # the usual form: reasoning, then the answer (leading whitespace stripped)
        ("<think>\nclick(e3)? no.\n</think>\n\nclick(e5)", SplitReply("<think>\nclick(e3)? no.\n", "click(e5)", True)),
        # the template opened <think> in the prompt: only the closing tag is in the reply
        ("take key first\n</think>open chest", SplitReply("take key first\n", "open chest", True)),
        ("</think>", SplitReply("", "", True)),
        # several closing tags: the answer follows the last one
        ("<think>a</think> 3 </think>\n 7", SplitReply("<think>a</think> 3 ", "7", True)),
        # opened but never closed (cut at the token limit): the environment sees nothing
        ("<think>\nso 3 + 4 is", SplitReply("<think>\nso 3 + 4 is", "", True)),
        ("\n  <think> 5", SplitReply("\n  <think> 5", "", True)),
        # a <think> that does not open the reply is text like any other
        ("go east <think>", SplitReply("", "go east <think>")),
    ],
)
def test_split_for_think_and_auto(text: str, expected: SplitReply) -> None:
    assert split_reply(text, "think") == expected
    assert split_reply(text, "auto") == expected


@pytest.mark.parametrize("text", ["<think>a</think>b", "<think> never closed", "plain"])
def test_none_never_splits(text: str) -> None:
    assert split_reply(text, "none") == SplitReply("", text)


def test_an_unknown_mode_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"model_config\.reasoning must be one of auto, think, none \(got 'r1'\)"):
        split_reply("x", "r1")
