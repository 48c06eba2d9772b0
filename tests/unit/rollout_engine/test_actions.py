"""Parsing a model reply into one TextWorld command or one MiniWoB++ browser action."""

from __future__ import annotations

import pytest

from rollout_engine.envs.actions import WebAction, parse_command, parse_web_action


@pytest.mark.parametrize(
    ("reply", "command"),
    [
        ("go east", "go east"),
        ("> Go East.", "go east"),
        ("Command: `take key`", "take key"),
        ("Action: open chest", "open chest"),
        ('"look"', "look"),
        ("```\ntake key\n```", "take key"),
        ("\n\n  inventory  \nbecause I want to see", "inventory"),
        ("**put apple on table**", "put apple on table"),
    ],
)
def test_command_is_first_line_without_prefix_quotes_or_punctuation(reply: str, command: str) -> None:
    assert parse_command(reply) == command


@pytest.mark.parametrize("reply", ["", "   \n \t", "```\n```", "> ", "Command:"])
def test_empty_reply_has_no_command(reply: str) -> None:
    assert parse_command(reply) is None


def test_a_sentence_longer_than_the_word_limit_is_not_a_command() -> None:
    sentence = "I think the best thing to do now would be to go east and then take the key"
    assert parse_command(sentence) is None
    assert parse_command(sentence, max_words=40) == sentence.lower()


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("click(e4)", WebAction("click", ref="e4")),
        ("I will CLICK [f1e12] now", WebAction("click", ref="f1e12")),
        ('click(ref="e4")', WebAction("click", ref="e4")),
        ("The button: click on e4.", WebAction("click", ref="e4")),
        ('type(f1e5, "Nieves")', WebAction("type", ref="f1e5", text="Nieves")),
        ("fill(e5, Nieves)", WebAction("type", ref="e5", text="Nieves")),
        ('type e5 "a b)"', WebAction("type", ref="e5", text="a b)")),
        ("type(ref=e5, text='x y')", WebAction("type", ref="e5", text="x y")),
        ('answer("42")', WebAction("answer", text="42")),
        ("Answer: 42", WebAction("answer", text="42")),
    ],
)
def test_web_action_syntax_and_its_variants(reply: str, action: WebAction) -> None:
    assert parse_web_action(reply) == action


def test_the_first_action_in_the_reply_wins() -> None:
    assert parse_web_action('type(e5, "x") and then click(e4)') == WebAction("type", ref="e5", text="x")
    assert parse_web_action('click(e4) and then type(e5, "x")') == WebAction("click", ref="e4")


@pytest.mark.parametrize(
    "reply",
    ["", "I would click the button", "click(button)", "the answer is 42", "click(x4)", "retype(e5, 'x')"],
)
def test_reply_without_a_well_formed_action_is_none(reply: str) -> None:
    assert parse_web_action(reply) is None


def test_web_action_json_omits_absent_fields() -> None:
    assert WebAction("click", ref="e4").to_json() == {"kind": "click", "ref": "e4"}
    assert WebAction("answer", text="7").to_json() == {"kind": "answer", "text": "7"}
