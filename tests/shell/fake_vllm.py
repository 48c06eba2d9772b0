"""A stand-in for vLLM's OpenAI server in the shell and driver tests: answers /health and /v1/models, a
greedy chat completion with logprobs (the fingerprint of the loaded weights), and the dev endpoints of an
in-place reload (POST /collective_rpc, /reset_prefix_cache, /reset_encoder_cache, /reset_mm_cache) and of sleep
mode (POST /sleep, /wake_up).

python fake_vllm.py --port 8999 --served-model-name policy --model /data/models/m [--prefix-cache-held]
    [--same-outputs] [--no-reload] [--no-encoder-reset]

Other arguments (the rest of vLLM's command line: -m vllm.entrypoints.openai.api_server --dtype ...) are
ignored, so a serve interpreter may run it with vLLM's arguments as they are.
--prefix-cache-held: /reset_prefix_cache answers {"success":false}, as vLLM does while requests hold blocks.
--same-outputs: the completion is the same whatever the weights (an update too small to show).
--no-reload: /collective_rpc is not there (404), as on a server without VLLM_SERVER_DEV_MODE.
--no-encoder-reset: /reset_encoder_cache is not there (404).
GET /fake/completions (not vLLM's) answers how many chat completions it served.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prefix-cache-held", action="store_true")
    parser.add_argument("--same-outputs", action="store_true")
    parser.add_argument("--no-reload", action="store_true")
    parser.add_argument("--no-encoder-reset", action="store_true")
    args, _vllm_args = parser.parse_known_args()
    # compact, as vLLM answers: PolicyServer.serves matches "id" to the name and "root" to the model
    models = {"object": "list", "data": [{"id": args.served_model_name, "object": "model", "root": args.model}]}
    answers = {"/health": b"", "/v1/models": json.dumps(models, separators=(",", ":")).encode()}
    posts = {
        "/reset_prefix_cache": b'{"success":%s}' % (b"false" if args.prefix_cache_held else b"true"),
        "/reset_encoder_cache": b"",
        "/reset_mm_cache": b"",
        "/sleep?level=1": b"",
        "/wake_up": b"",
    }
    if args.no_encoder_reset:
        del posts["/reset_encoder_cache"]
    if not args.no_reload:
        posts["/collective_rpc"] = b'{"results":[null]}'
    weights = {"path": args.model}
    served = {"completions": 0}

    def completion() -> bytes:
        """One greedy token whose text names the loaded weights (constant with --same-outputs)."""
        token = "7" if args.same_outputs else weights["path"]
        content = [{"token": token, "logprob": -0.25}]
        return json.dumps({"choices": [{"logprobs": {"content": content}}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/fake/completions":
                self.answer(str(served["completions"]).encode())
                return
            self.answer(answers.get(self.path))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/v1/chat/completions":
                served["completions"] += 1
                self.answer(completion())
                return
            if self.path == "/collective_rpc" and not args.no_reload:
                weights["path"] = json.loads(body)["kwargs"]["weights_path"]
            self.answer(posts.get(self.path))

        def answer(self, body: bytes | None) -> None:
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
