"""The judge's constrained decoding: when vLLM's structured-outputs regex is sent, what it allows always parses
and always fits the reply budget; which endpoints get it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rollout_engine import schema
from rollout_engine.config import OpenAIConfig, PolicyConfig
from rollout_engine.judge import Judge, parse_verdict, resolve_endpoint, verdict_regex


@pytest.mark.parametrize("max_tokens", [8, 12, 13, 48, 256])
def test_every_reply_the_regex_allows_parses_and_fits_the_budget(max_tokens: int) -> None:
    pattern = re.compile(verdict_regex(max_tokens))
    longest_reason = max(0, max_tokens - 12)
    for verdict, passed in (("SUCCESS", True), ("FAILURE", False)):
        replies = [f"Verdict: {verdict}"]
        if longest_reason:
            replies.append("x" * longest_reason + f"\nVerdict: {verdict}")
        for reply in replies:
            assert pattern.fullmatch(reply) and parse_verdict(reply) is passed
            # each reason character is one byte, so at most one token; 12 tokens are left for the newline, the
            # verdict line (7 tokens with the newline in SmolLM2's vocabulary) and the end of the reply
            assert len(reply.removesuffix(f"Verdict: {verdict}").encode()) + 11 <= max(max_tokens, 12)
    too_long = "x" * (longest_reason + 1) + "\nVerdict: SUCCESS"
    two_verdicts = "Verdict: SUCCESS \nVerdict: FAILURE"  # a reply the e2e once got before the reason lost ':'
    for reply in (too_long, "ok\nok\nVerdict: SUCCESS", "Verdict: maybe", two_verdicts):
        assert not pattern.fullmatch(reply)


def test_auto_constrains_the_policy_server_only() -> None:
    policy = PolicyConfig(base_url="http://127.0.0.1:8999/v1", model="policy")
    assert resolve_endpoint(OpenAIConfig(), policy, "evaluation").constrained
    other = OpenAIConfig(base_url="https://api.example.invalid/v1", model="gpt")
    assert not resolve_endpoint(other, policy, "evaluation").constrained
    assert resolve_endpoint(
        OpenAIConfig(**{**vars(other), "constrain_verdict": "regex"}), policy, "evaluation"
    ).constrained
    assert not resolve_endpoint(OpenAIConfig(constrain_verdict="none"), policy, "evaluation").constrained


def test_a_bad_setting_names_the_field_the_value_and_the_choices() -> None:
    """The schema's check (rollout_engine.config.validate runs it on every section)."""
    assert schema.problems(OpenAIConfig(constrain_verdict="json"), "openai_config") == [
        "openai_config.constrain_verdict must be one of auto, regex, none (got 'json')"
    ]


class RecordingClient:
    def __init__(self, reply: str) -> None:
        self.calls: list[dict] = []
        self.reply = reply
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kwargs):
        self.calls.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])

    async def close(self) -> None:
        return None


async def test_the_request_carries_the_regex_only_when_constrained() -> None:
    policy = PolicyConfig(base_url="http://127.0.0.1:8999/v1", model="policy")
    client = RecordingClient("Fine.\nVerdict: FAILURE")
    judge = Judge(OpenAIConfig(max_tokens=48), policy, client=client)
    assert await judge.verdict([{"role": "user", "content": "?"}]) == (False, "Fine.\nVerdict: FAILURE")
    assert client.calls[0]["extra_body"] == {"structured_outputs": {"regex": verdict_regex(48)}}
    client = RecordingClient("Verdict: SUCCESS")
    judge = Judge(OpenAIConfig(constrain_verdict="none"), policy, client=client)
    assert (await judge.verdict([{"role": "user", "content": "?"}]))[0] is True
    assert client.calls[0]["extra_body"] is None
