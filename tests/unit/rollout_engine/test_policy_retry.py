"""Retry policy of the policy client, with a scripted fake OpenAI client (no network)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import openai
import pytest

from rollout_engine.config import PolicyConfig
from rollout_engine.errors import ConfigError, ContextOverflowError, ModelError, PolicyDown
from rollout_engine.policy import PolicyClient

REQUEST = httpx.Request("POST", "http://test/v1/chat/completions")


def status_error(cls: type, code: int, message: str = "boom") -> Exception:
    return cls(message, response=httpx.Response(code, request=REQUEST), body=None)


def reply(text: str = "42") -> SimpleNamespace:
    choice = SimpleNamespace(message=SimpleNamespace(content=text), finish_reason="stop", token_ids=[7, 8])
    return SimpleNamespace(
        choices=[choice], usage=SimpleNamespace(prompt_tokens=5, completion_tokens=2), prompt_token_ids=[1, 2, 3, 4, 5]
    )


class ScriptedClient:
    """Plays a script: each entry is a reply to return or an exception to raise."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.calls: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self.models = SimpleNamespace(list=self.list_models)

    async def create(self, **kwargs):
        self.calls.append(kwargs)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def list_models(self):
        return await self.create()

    async def close(self) -> None:
        return None


async def no_sleep(seconds: float) -> None:
    sleeps.append(seconds)


sleeps: list[float] = []


def client_for(script: list, retries: int = 3) -> tuple[PolicyClient, ScriptedClient]:
    fake = ScriptedClient(script)
    cfg = PolicyConfig(max_retries=retries, retry_backoff_s=0.5, retry_backoff_max_s=1.5)
    return PolicyClient(cfg, max_sessions=2, client=fake, sleep=no_sleep), fake


async def test_retries_connection_429_and_5xx_then_succeeds() -> None:
    sleeps.clear()
    script = [
        openai.APIConnectionError(request=REQUEST),
        status_error(openai.RateLimitError, 429),
        status_error(openai.InternalServerError, 503),
        reply("7"),
    ]
    policy, fake = client_for(script)
    completion = await policy.chat([{"role": "user", "content": "hi"}])
    assert completion.text == "7" and completion.prompt_token_ids == [1, 2, 3, 4, 5]
    assert completion.completion_token_ids == [7, 8] and completion.completion_tokens == 2
    assert len(fake.calls) == 4 and sleeps == [0.5, 1.0, 1.5]  # exponential, capped
    assert fake.calls[0]["extra_body"] == {"return_token_ids": True}


async def test_gives_up_after_bounded_retries() -> None:
    models = SimpleNamespace(data=[SimpleNamespace(id="policy")])  # the health probe after the retries: up
    policy, fake = client_for([openai.APIConnectionError(request=REQUEST)] * 3 + [models], retries=2)
    with pytest.raises(ModelError, match="after 3 attempts"):
        await policy.chat([])
    assert len(fake.calls) == 4


async def test_a_server_that_fails_the_health_probe_after_the_retries_is_down_not_a_model_error() -> None:
    refused = openai.APIConnectionError(request=REQUEST)
    policy, fake = client_for([refused, status_error(openai.InternalServerError, 500), refused], retries=1)
    with pytest.raises(PolicyDown, match=r"policy server at http://127\.0\.0\.1:8000/v1 stopped answering"):
        await policy.chat([])
    assert len(fake.calls) == 3  # two attempts, then the probe (GET /models), refused too


async def test_a_server_that_still_lists_its_models_failed_this_request_only() -> None:
    models = SimpleNamespace(data=[SimpleNamespace(id="policy")])
    policy, fake = client_for([status_error(openai.InternalServerError, 500)] * 2 + [models], retries=1)
    with pytest.raises(ModelError, match="after 2 attempts") as caught:
        await policy.chat([])
    assert not isinstance(caught.value, PolicyDown) and len(fake.calls) == 3


async def test_client_errors_are_not_retried_and_overflow_is_recognised() -> None:
    policy, fake = client_for([status_error(openai.BadRequestError, 400, "bad role")])
    with pytest.raises(ModelError, match="bad role"):
        await policy.chat([])
    assert len(fake.calls) == 1
    overflow = status_error(openai.BadRequestError, 400, "This model's maximum context length is 2048 tokens")
    policy, _ = client_for([overflow])
    with pytest.raises(ContextOverflowError):
        await policy.chat([])


async def test_unreachable_server_is_a_config_error_naming_the_url() -> None:
    policy, _ = client_for([openai.APIConnectionError(request=REQUEST)] * 2, retries=1)
    with pytest.raises(
        ConfigError, match=r"policy_config\.base_url is unreachable \(got 'http://127\.0\.0\.1:8000/v1'"
    ):
        await policy.check_server()


async def test_unknown_model_is_a_config_error_listing_served_models() -> None:
    policy, _ = client_for([SimpleNamespace(data=[SimpleNamespace(id="other")])])
    with pytest.raises(ConfigError, match=r"policy_config\.model is not served .*served: \['other'\]"):
        await policy.check_server()
