"""The policy client: the official `openai` async client against vLLM.

`PolicyClient.chat(messages)` sends one chat completion with the sampling
settings of `policy_config`, at most `max_vllm_sessions` at a time (one
semaphore), and returns a `Completion` with the reply, token counts and, when
the server returns them (vLLM with `return_token_ids`), the prompt and
completion token ids, and with `return_logprobs` (chat completions `logprobs`,
`top_logprobs` 0) the sampled tokens' log-probabilities, one per completion id
(a count that differs is a `ModelError`, never padded). `model_config.chat_template_kwargs` (enable_thinking:
false), when set, goes with every request as vLLM's `chat_template_kwargs`.

Retries (`rollout_engine.retries`, the one retry layer): connection errors,
timeouts, 429 and 5xx are retried `max_retries` times with exponential backoff
(`retry_backoff_s` doubling up to `retry_backoff_max_s`); the semaphore is not
held while waiting. A prompt too long for the model raises
`ContextOverflowError`; other failures raise `ModelError`, unless the retries
ran out on connection trouble, timeouts or 5xx and the server then fails a
health probe (`GET /models` within `PROBE_S`): that is `PolicyDown`, an
infrastructure failure that stops the rollout instead of failing the episode.
So one `chat()` sends at most `max_retries + 1` requests, plus that one probe.
`check_server()` is the start-up probe: an unreachable server or an unknown
model name is a `ConfigError` after bounded retries, never a hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import openai

from rollout_engine.config import PolicyConfig
from rollout_engine.errors import ConfigError, ContextOverflowError, ModelError, PolicyDown
from rollout_engine.retries import Backoff, build_openai_client, call_with_retries, is_retryable
from rollout_engine.types import Completion, Message, logprobs_problem

logger = logging.getLogger(__name__)

#: seconds the health probe after a failed request may take
PROBE_S = 10.0
#: decimals kept of a sampled token's log-probability: vLLM computes them in float32 (about 7 significant
#: digits); 1e-6 moves an importance ratio by 1e-6 and halves the journal's bytes per value
LOGPROB_DECIMALS = 6


@dataclass
class PolicyStats:
    """Running totals for metrics (tokens/s)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class PolicyClient:
    """Chat completions for the episode loop (implements `envs.base.ChatPolicy`)."""

    def __init__(
        self,
        cfg: PolicyConfig,
        max_sessions: int,
        client: Any | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.client = client or build_openai_client(cfg.base_url, cfg.api_key_env, cfg.request_timeout_s)
        self.sessions = asyncio.Semaphore(max_sessions)
        self.backoff = Backoff(cfg.retry_backoff_s, cfg.retry_backoff_max_s)
        self.sleep = sleep
        self.stats = PolicyStats()

    def request_args(self, messages: list[Message]) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.cfg.return_token_ids:
            extra["return_token_ids"] = True
        if self.cfg.top_k > 0:
            extra["top_k"] = self.cfg.top_k
        if self.chat_template_kwargs:
            extra["chat_template_kwargs"] = self.chat_template_kwargs
        args = {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
            "max_tokens": self.cfg.max_new_tokens,
            "extra_body": extra or None,
        }
        if self.cfg.return_logprobs:
            # the sampled token's own log-probability only: top_logprobs 0 adds no alternatives to the reply
            args |= {"logprobs": True, "top_logprobs": 0}
        return args

    async def _once(self, args: dict[str, Any]) -> Any:
        async with self.sessions:
            return await self.client.chat.completions.create(**args)

    async def chat(self, messages: list[Message]) -> Completion:
        args = self.request_args(messages)
        try:
            resp = await call_with_retries(
                lambda: self._once(args),
                self.cfg.max_retries,
                self.backoff,
                f"chat completion at {self.cfg.base_url}",
                self.sleep,
            )
        except ContextOverflowError:
            raise
        except ModelError as exc:
            if is_retryable(exc.__cause__) and not await self.answers():
                raise PolicyDown(f"the policy server at {self.cfg.base_url} stopped answering ({exc})") from exc
            raise
        completion = parse_completion(resp)
        self.stats.requests += 1
        self.stats.prompt_tokens += completion.prompt_tokens
        self.stats.completion_tokens += completion.completion_tokens
        return completion

    async def answers(self) -> bool:
        """The health probe: does the server list its models within PROBE_S?"""
        try:
            await asyncio.wait_for(self.client.models.list(), PROBE_S)
        except (openai.OpenAIError, TimeoutError):
            return False
        return True

    async def check_server(self) -> None:
        """Fail fast (ConfigError) when the server is unreachable or does not serve `model`."""
        what = f"policy server {self.cfg.base_url}"
        try:
            models = await call_with_retries(
                self.client.models.list, self.cfg.max_retries, self.backoff, what, self.sleep
            )
        except ModelError as exc:
            raise ConfigError(
                f"policy_config.base_url is unreachable (got {self.cfg.base_url!r}: {exc.__cause__}); "
                "start the server or fix the URL"
            ) from None
        served = [m.id for m in models.data]
        if self.cfg.model not in served:
            raise ConfigError(
                f"policy_config.model is not served at {self.cfg.base_url} (got {self.cfg.model!r}; "
                f"served: {served}); set policy_config.model to one of them"
            )

    async def close(self) -> None:
        await self.client.close()


def parse_completion(resp: Any) -> Completion:
    """A chat-completion response as a Completion; vLLM's extra fields give the token ids."""
    if not resp.choices:
        raise ModelError("the server returned no choices")
    choice = resp.choices[0]
    usage = resp.usage
    completion_ids = getattr(choice, "token_ids", None)
    logprobs = parse_logprobs(choice)
    problem = logprobs_problem(completion_ids, logprobs)
    if problem:
        raise ModelError(f"the server's reply does not align its log-probabilities with its tokens: {problem}")
    return Completion(
        text=choice.message.content or "",
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        prompt_token_ids=getattr(resp, "prompt_token_ids", None),
        completion_token_ids=completion_ids,
        completion_logprobs=logprobs,
    )


def parse_logprobs(choice: Any) -> list[float] | None:
    """The sampled tokens' log-probabilities of one choice (`logprobs.content[i].logprob`), rounded to
    LOGPROB_DECIMALS; None when the server sent none. vLLM reports -9999.0 for a token it has no value for."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if content is None:
        return None
    return [round(float(entry.logprob), LOGPROB_DECIMALS) for entry in content]
