"""The real rollout engine (`python -m rollout_engine`) against a scripted OpenAI server that answers like a
thinking model: the environment scores the answer after the reasoning, the journal keeps the reply as sampled,
a cut reply is counted and no success, and every request carries the chat template's arguments. No vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


class ThinkingServer:
    """/v1/models and /v1/chat/completions; the reply to a question is scripted by a word of it."""

    def __init__(self, rows: list[dict[str, Any]], replies: dict[str, dict[str, Any]]) -> None:
        self.rows = rows  # the task file's rows
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send(json.dumps({"object": "list", "data": [{"id": "policy", "object": "model"}]}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                server.requests.append(body)
                question = body["messages"][-1]["content"]
                reply = next(r for word, r in server.replies.items() if word in question)
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply["content"]},
                    "finish_reason": reply["finish_reason"],
                    "token_ids": list(range(reply["tokens"])),  # vLLM's return_token_ids
                }
                usage = {"prompt_tokens": 3, "completion_tokens": reply["tokens"], "total_tokens": reply["tokens"] + 3}
                self.send(
                    json.dumps(
                        {
                            "id": "c",
                            "object": "chat.completion",
                            "created": 0,
                            "model": "policy",
                            "choices": [choice],
                            "usage": usage,
                            "prompt_token_ids": [1, 2, 3],
                        }
                    )
                )

            def send(self, text: str) -> None:
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def chain_sums(n: int) -> list[dict[str, Any]]:
    """`n` reasoning-gym task rows with distinct questions."""
    import reasoning_gym

    items = reasoning_gym.create_dataset("chain_sum", size=40, seed=5, min_terms=2, max_terms=2, min_digits=2)
    rows: dict[str, dict[str, Any]] = {}
    for item in items:
        item = json.loads(json.dumps(item))
        rows.setdefault(item["question"], item)
    return [
        {"task_id": f"t{i}", "task_name": item["question"], "metadata": {"dataset": "chain_sum", "entry": item}}
        for i, item in enumerate(list(rows.values())[:n])
    ]


@pytest.fixture
def server() -> Iterator[ThinkingServer]:
    rows = chain_sums(3)
    thinks, cut, plain = (row["metadata"]["entry"] for row in rows)
    served = ThinkingServer(
        rows,
        {
            thinks["question"]: {
                "content": f"<think>\nMaybe 1000? No: 1000 - 1 is not it.\n</think>\n\n{thinks['answer']}",
                "finish_reason": "stop",
                "tokens": 20,
            },
            cut["question"]: {"content": "<think>\nFirst 12, then", "finish_reason": "length", "tokens": 8},
            plain["question"]: {"content": plain["answer"], "finish_reason": "stop", "tokens": 2},
        },
    )
    thread = threading.Thread(target=served.httpd.serve_forever, daemon=True)
    thread.start()
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def test_a_thinking_models_rollout_end_to_end(tmp_path: Path, server: ThinkingServer) -> None:
    data, log = tmp_path / "data", tmp_path / "log"
    data.mkdir()
    (data / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in server.rows))
    command = [
        sys.executable, "-m", "rollout_engine", "--config-name", "rollout_train",
        f"data_path={data}", f"log_path={log}", f"policy_config.base_url={server.url}",
        "env_config.train_tasks=tasks.jsonl", "env_config.train_tasks_rollout_size=0",
        "env_config.n_samples_per_task=1", "env_config.live_view=plain",
        "model_config.reasoning=think", "+model_config.chat_template_kwargs.enable_thinking=true",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    journal = log / "trajectories" / "train" / "iter_0000" / "rank_0.jsonl"
    rows = {row["task_id"]: row for row in map(json.loads, journal.read_text().splitlines())}
    thinks, cut, plain = rows["t0"], rows["t1"], rows["t2"]
    answer = server.rows[0]["metadata"]["entry"]["answer"]
    (turn,) = thinks["turns"]
    assert thinks["success"] and thinks["reward"] == 1.0 and thinks["info"]["answer"] == answer
    assert turn["response"].startswith("<think>\nMaybe 1000?") and turn["env_reply"] == answer
    assert turn["completion_token_ids"] == list(range(20)) and turn["finish_reason"] == "stop"
    (turn,) = cut["turns"]
    assert not cut["success"] and cut["reward"] == 0.0 and cut["status"] == "ok"
    assert turn["env_reply"] == "" and turn["invalid_action"] and turn["finish_reason"] == "length"
    assert "finish_reason length" in cut["info"]["truncated"]
    assert plain["success"] and plain["turns"][0]["env_reply"] is None

    (record,) = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    assert (record["truncated_turns"], record["truncated_episodes"], record["truncated_turn_rate"]) == (1, 1, 0.3333)
    assert record["success_rate"] == 0.6667
    status = json.loads((log / "status.json").read_text())
    assert (status["truncated_turns"], status["truncated_episodes"]) == (1, 1)
    assert "1 replies cut" in done.stderr

    assert len(server.requests) == 3
    for request in server.requests:
        assert request["chat_template_kwargs"] == {"enable_thinking": True} and request["return_token_ids"]
