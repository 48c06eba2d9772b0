"""The LLM judge: any OpenAI-compatible endpoint, strict verdict parsing, retries.

Settings come from `openai_config` with per-purpose overrides
(`openai_config.evaluation.{base_url,model,api_key_env}`); an empty base URL
or model falls back to `policy_config` (the local vLLM judging). A named API
key variable that is unset is a `ConfigError` when the environment is built.

The judge must end its reply with a line `Verdict: SUCCESS` or
`Verdict: FAILURE` (markdown bold tolerated). Anything else (no verdict, two
different verdicts) is unparseable and asked again. Unparseable replies,
connection errors, timeouts, 429 and 5xx share one budget
(`rollout_engine.retries`, the one retry layer): a judgement sends at most
`openai_config.max_retries + 1` requests (4 by default), so it takes at most
that many times `request_timeout_s` plus the backoffs between them
(`retry_backoff_s` doubling, capped at 8 s). Then, or at once on any other
error, it raises `JudgeError`, which the engine records as `judge_error`,
excluded from success rates and training.

With `openai_config.constrain_verdict` `regex` (`auto` does so when the judge
is the policy server, our vLLM) the request carries vLLM's structured-outputs
regex (`verdict_regex`): at most a short reason on one line, then the verdict
line, sized so that the whole reply fits in `max_tokens`. Even a 135M model
then always gives a verdict (a reply cut by `max_tokens` is impossible).

A thinking judge: the verdict is read from the reply after its reasoning
(`rollout_engine.reasoning`), split by `model_config.reasoning` when the judge
is the policy server and always (`auto`) for another endpoint, so a verdict
weighed inside `<think>` never counts. A judge that is the policy server also
gets `model_config.chat_template_kwargs` with each request, as the policy does.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rollout_engine.config import ModelConfig, OpenAIConfig, PolicyConfig
from rollout_engine.errors import ConfigError, JudgeError, ModelError
from rollout_engine.reasoning import split_reply
from rollout_engine.retries import Backoff, build_openai_client, call_with_retries, is_retryable
from rollout_engine.types import Message

_VERDICT = re.compile(r"^[\s*#>_-]*verdict[\s*_]*:[\s*_]*(success|failure)[\s*_.]*$", re.IGNORECASE | re.MULTILINE)


def verdict_regex(max_tokens: int) -> str:
    """A reply of an optional one-line reason (no colon) and the verdict line. Every token is at least one character,
    so a reason of at most `max_tokens - 12` characters and the verdict line (at most 12 tokens here) fit the budget."""
    reason = max(0, max_tokens - 12)
    # printable ASCII but ':' (one byte, so at most one token each; and no verdict line of its own: the reason
    # cannot read `Verdict: SUCCESS` before the real verdict says FAILURE, as it did once in the e2e)
    prefix = f"(?:[ -9;-~]{{1,{reason}}}\\n)?" if reason else ""
    return prefix + "Verdict: (SUCCESS|FAILURE)"


def parse_verdict(text: str) -> bool | None:
    """True / False for a single clear verdict line, None when absent or contradictory."""
    found = {m.group(1).lower() for m in _VERDICT.finditer(text)}
    if len(found) != 1:
        return None
    return found.pop() == "success"


@dataclass(frozen=True)
class JudgeEndpoint:
    base_url: str
    model: str
    api_key_env: str
    #: send vLLM's structured-outputs regex (only a vLLM understands it)
    constrained: bool = False
    #: the judge is the policy server (our vLLM, serving the policy's model)
    policy_server: bool = False


def resolve_endpoint(cfg: OpenAIConfig, policy: PolicyConfig, purpose: str) -> JudgeEndpoint:
    """Override for `purpose`, else openai_config, else the policy server; checks the key variable."""
    override = getattr(cfg, purpose)
    base_url = override.base_url or cfg.base_url or policy.base_url
    policy_server = base_url.rstrip("/") == policy.base_url.rstrip("/")
    endpoint = JudgeEndpoint(
        base_url=base_url,
        model=override.model or cfg.model or policy.model,
        api_key_env=override.api_key_env if override.api_key_env is not None else cfg.api_key_env,
        constrained=cfg.constrain_verdict == "regex" or (cfg.constrain_verdict == "auto" and policy_server),
        policy_server=policy_server,
    )
    if endpoint.api_key_env and not os.environ.get(endpoint.api_key_env):
        raise ConfigError(
            f"openai_config.api_key_env names {endpoint.api_key_env!r}, which is not set; export it "
            "or set openai_config.api_key_env='' for a server without keys"
        )
    return endpoint


class UnparseableVerdict(JudgeError):
    """A reply without one clear verdict line (asked again within the judgement's budget)."""

    def __init__(self, reply: str) -> None:
        super().__init__(f"no verdict line in {reply[-300:]!r}")
        self.reply = reply


def is_worth_asking_again(exc: BaseException) -> bool:
    """What a judgement retries: an unparseable reply, and what every OpenAI-compatible call retries."""
    return isinstance(exc, UnparseableVerdict) or is_retryable(exc)


class Judge:
    """Verdicts from one endpoint (one purpose)."""

    def __init__(
        self,
        cfg: OpenAIConfig,
        policy: PolicyConfig,
        purpose: str = "evaluation",
        client=None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        model: ModelConfig | None = None,
    ) -> None:
        self.cfg = cfg
        self.endpoint = resolve_endpoint(cfg, policy, purpose)
        self.client = client
        self.backoff = Backoff(cfg.retry_backoff_s, max(cfg.retry_backoff_s, 8.0))
        self.sleep = sleep
        model = model or ModelConfig()
        # another endpoint's model is not ours: split off whatever reasoning it writes
        self.reasoning = model.reasoning if self.endpoint.policy_server else "auto"
        self.chat_template_kwargs = dict(model.chat_template_kwargs) if self.endpoint.policy_server else {}

    async def verdict(self, messages: list[Message]) -> tuple[bool, str]:
        """(passed, judge reply); raises JudgeError when `max_retries + 1` requests gave no verdict."""
        if self.client is None:
            self.client = build_openai_client(
                self.endpoint.base_url, self.endpoint.api_key_env, self.cfg.request_timeout_s
            )

        async def ask() -> tuple[bool, str]:
            resp = await self._create(messages)
            reply = (resp.choices[0].message.content or "") if resp.choices else ""
            passed = parse_verdict(split_reply(reply, self.reasoning).answer)
            if passed is None:
                raise UnparseableVerdict(reply)
            return passed, reply

        tries = self.cfg.max_retries + 1
        try:
            return await call_with_retries(
                ask,
                self.cfg.max_retries,
                self.backoff,
                f"judge {self.endpoint.base_url}",
                self.sleep,
                retry_on=is_worth_asking_again,
            )
        except UnparseableVerdict as exc:
            raise JudgeError(f"unparseable verdict after {tries} tries; last reply: {exc.reply[-300:]!r}") from None
        except ModelError as exc:
            raise JudgeError(str(exc)) from exc

    async def _create(self, messages: list[Message]):
        extra: dict[str, Any] = {}
        if self.endpoint.constrained:
            extra["structured_outputs"] = {"regex": verdict_regex(self.cfg.max_tokens)}
        if self.chat_template_kwargs:
            extra["chat_template_kwargs"] = self.chat_template_kwargs
        return await self.client.chat.completions.create(
            model=self.endpoint.model,
            messages=messages,
            temperature=self.cfg.temperature,
            max_tokens=self.cfg.max_tokens,
            extra_body=extra or None,
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
