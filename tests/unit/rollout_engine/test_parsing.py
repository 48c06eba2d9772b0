"""Answer extraction, judge verdict parsing and WebGym reference flattening."""

from __future__ import annotations

import pytest

from rollout_engine.answers import extract_answer
from rollout_engine.envs.judged import flatten_reference
from rollout_engine.judge import parse_verdict


@pytest.mark.parametrize(
    ("text", "rule", "expected"),
    [
        ("17 + 25 = 42", "first_number", "17"),
        ("17 + 25 = 42", "last_number", "42"),
        ("<answer>7</answer> then 9", "tag_then_last_number", "7"),
        ("so 9", "tag_then_last_number", "9"),
        ("so 9", "tag", None),
        ("the total is 1,024.", "last_number", "1024"),
        ("it is -3.5", "first_number", "-3.5"),
        ("no digits here", "tag_then_first_number", None),
        ("  Paris \n", "text", "Paris"),
    ],
)
def test_extract_answer(text: str, rule: str, expected: str | None) -> None:
    assert extract_answer(text, rule) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer matches.\nVerdict: SUCCESS", True),
        ("Wrong city.\n**Verdict:** FAILURE", False),
        ("verdict: success.", True),
        ("Looks right to me.", None),  # no verdict: a judge error, never a pass
        ("Verdict: SUCCESS\nVerdict: FAILURE", None),  # contradictory
        ("NOT SUCCESS", None),
        ("The verdict: SUCCESS is likely", None),  # must be its own line
    ],
)
def test_parse_verdict_is_strict(text: str, expected: bool | None) -> None:
    assert parse_verdict(text) is expected


def test_flatten_reference_forms() -> None:
    assert flatten_reference("one") == ["one"]
    assert flatten_reference(["a", {"description": "b", "difficulty": 2}]) == ["a", "b"]
    groups = [{"id": 1, "description": "prices", "facts": ["x < 5", "y"]}]
    assert flatten_reference(groups) == ["[Group 1: prices] x < 5", "[Group 1: prices] y"]
    assert flatten_reference(None) == []
