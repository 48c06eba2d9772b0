"""One retry layer: a judgement sends at most `openai_config.max_retries + 1` requests, whatever fails, and a
policy request at most `policy_config.max_retries + 1` plus one health probe. Counted on the real `openai`
client over a scripted HTTP transport (no network), so the SDK's own retries would show up too."""

from __future__ import annotations

import httpx
import pytest

from rollout_engine.config import OpenAIConfig, PolicyConfig
from rollout_engine.errors import JudgeError, ModelError, PolicyDown
from rollout_engine.judge import Judge
from rollout_engine.policy import PolicyClient
from rollout_engine.retries import build_openai_client

BASE = "http://127.0.0.1:8999/v1"


def completion(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class Server:
    """Answers each request with the next scripted item: an HTTP status, a reply text, or an httpx error to raise."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        item = self.script.pop(0) if self.script else 503
        if isinstance(item, type) and issubclass(item, httpx.TransportError):
            raise item("scripted", request=request)
        if isinstance(item, int):
            return httpx.Response(item, json={"error": {"message": f"scripted {item}"}})
        if item == "models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "policy", "object": "model"}]})
        return httpx.Response(200, json=completion(item))

    def client(self):
        return build_openai_client(BASE, "", 5.0, http_client=httpx.AsyncClient(transport=httpx.MockTransport(self)))


class Sleeps(list):
    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def judge_for(server: Server, retries: int, sleeps: Sleeps) -> Judge:
    cfg = OpenAIConfig(max_retries=retries, retry_backoff_s=0.5, constrain_verdict="none")
    return Judge(cfg, PolicyConfig(base_url=BASE), client=server.client(), sleep=sleeps)


ASK = [{"role": "user", "content": "Is 2+2=4 right?"}]


@pytest.mark.parametrize("retries", [0, 1, 3, 5])
async def test_a_judgement_sends_at_most_max_retries_plus_one_requests(retries: int) -> None:
    for failure in (503, 429, httpx.ConnectError, httpx.ReadTimeout, "Looks fine to me."):
        server, sleeps = Server([failure] * 20), Sleeps()
        with pytest.raises(JudgeError, match=f"after {retries + 1} (attempts|tries)"):
            await judge_for(server, retries, sleeps).verdict(ASK)
        assert len(server.requests) == retries + 1, f"{failure!r}: {server.requests}"
        assert sleeps == [min(8.0, 0.5 * 2**i) for i in range(retries)]  # exponential, capped at 8 s


async def test_transport_failures_and_unparseable_replies_share_one_budget() -> None:
    script = [503, httpx.ConnectError, "No verdict here.", "Fine.\nVerdict: SUCCESS"]
    server = Server(script)
    assert await judge_for(server, 3, Sleeps()).verdict(ASK) == (True, "Fine.\nVerdict: SUCCESS")
    assert len(server.requests) == 4
    server = Server(script)
    with pytest.raises(JudgeError, match=r"unparseable verdict after 3 tries; last reply: 'No verdict here.'"):
        await judge_for(server, 2, Sleeps()).verdict(ASK)
    assert len(server.requests) == 3


async def test_a_refused_request_is_not_asked_again() -> None:
    server = Server([400, "Verdict: SUCCESS"])
    with pytest.raises(JudgeError, match="BadRequestError"):
        await judge_for(server, 3, Sleeps()).verdict(ASK)
    assert server.requests == ["POST /v1/chat/completions"]


def policy_for(server: Server, retries: int) -> PolicyClient:
    cfg = PolicyConfig(base_url=BASE, max_retries=retries, retry_backoff_s=0.0, retry_backoff_max_s=0.0)
    return PolicyClient(cfg, max_sessions=2, client=server.client(), sleep=Sleeps())


async def test_a_policy_request_is_sent_at_most_max_retries_plus_one_times_then_the_server_is_probed() -> None:
    server = Server([500] * 3 + ["models"])
    with pytest.raises(ModelError, match="after 3 attempts") as caught:
        await policy_for(server, 2).chat(ASK)
    assert not isinstance(caught.value, PolicyDown)
    assert server.requests == ["POST /v1/chat/completions"] * 3 + ["GET /v1/models"]
    server = Server([httpx.ConnectError] * 4)  # refused, and so is the probe: the server is down
    with pytest.raises(PolicyDown):
        await policy_for(server, 2).chat(ASK)
    assert server.requests == ["POST /v1/chat/completions"] * 3 + ["GET /v1/models"]
