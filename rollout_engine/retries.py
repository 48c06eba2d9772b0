"""The one retry layer of every OpenAI-compatible call (policy and judge), on tenacity.

    reply = await call_with_retries(lambda: client.chat.completions.create(...), 3, Backoff(0.5, 8.0), "chat")

`call` runs at most `retries + 1` times in all. Connection errors, timeouts,
429 and 5xx are retried (`is_retryable`), after a backoff of `first`,
`first * 2`, ... seconds capped at `cap`; a caller may widen what is retried
(`retry_on`: the judge also retries an unparseable verdict, within the same
budget). Nothing else is retried. When it gives up, an `openai` error becomes
a `ModelError` naming `what` (its `__cause__` is the last error, so a caller
can tell connection trouble from a refusal), a prompt too long for the model a
`ContextOverflowError`; any other exception is raised as it is. The SDK's own
retries must be off (`build_openai_client` does so): they would multiply ours.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential

from rollout_engine.errors import ContextOverflowError, ModelError

logger = logging.getLogger(__name__)

_OVERFLOW_HINTS = ("maximum context length", "context length", "too long", "max_model_len")


def build_openai_client(
    base_url: str, api_key_env: str, timeout_s: float, http_client: httpx.AsyncClient | None = None
) -> openai.AsyncOpenAI:
    """An AsyncOpenAI with the SDK's retries off (ours are the only layer) and a per-request timeout in seconds."""
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=key or "EMPTY", timeout=timeout_s, max_retries=0, http_client=http_client
    )


def is_retryable(exc: BaseException | None) -> bool:
    """Connection trouble, timeouts, 429 and 5xx are worth another try; other errors are not."""
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError | openai.RateLimitError):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500


def is_overflow(exc: BaseException) -> bool:
    return isinstance(exc, openai.BadRequestError) and any(h in str(exc).lower() for h in _OVERFLOW_HINTS)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff in seconds: first, first*2, ... capped at `cap`."""

    first: float
    cap: float


async def call_with_retries(
    call: Callable[[], Awaitable[Any]],
    retries: int,
    backoff: Backoff,
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    retry_on: Callable[[BaseException], bool] = is_retryable,
) -> Any:
    """Run `call`, retrying what `retry_on` accepts, at most `retries + 1` calls; see the module's docstring."""

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.debug("%s: %s, retry %d in %.1fs", what, type(exc).__name__, state.attempt_number, delay)

    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda exc: not is_overflow(exc) and retry_on(exc)),
        stop=stop_after_attempt(retries + 1),
        wait=wait_exponential(multiplier=backoff.first, exp_base=2, max=backoff.cap),
        sleep=sleep,
        before_sleep=log_retry,
        reraise=True,
    )
    try:
        async for attempt in retrying:  # `retrying(call)` would not await a lambda's coroutine
            with attempt:
                return await call()
    except openai.OpenAIError as exc:
        if is_overflow(exc):
            raise ContextOverflowError(f"{what}: prompt too long for the model ({exc})") from exc
        if retry_on(exc):
            raise ModelError(f"{what} failed after {retries + 1} attempts: {type(exc).__name__}: {exc}") from exc
        raise ModelError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable: tenacity either returned or raised")
