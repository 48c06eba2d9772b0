"""A stand-in for vLLM's OpenAI server in the shell tests: answers /health and /v1/models, and the two dev
endpoints of an in-place reload (POST /collective_rpc, POST /reset_prefix_cache), nothing else.

python fake_vllm.py --port 8999 --served-model-name policy --model /data/models/m [--prefix-cache-held]

--prefix-cache-held: /reset_prefix_cache answers {"success":false}, as vLLM does while requests hold blocks.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prefix-cache-held", action="store_true")
    args = parser.parse_args()
    # compact, as vLLM answers: vllm_serves matches "id":"<name>" and "root":"<model>"
    models = {"object": "list", "data": [{"id": args.served_model_name, "object": "model", "root": args.model}]}
    answers = {"/health": b"", "/v1/models": json.dumps(models, separators=(",", ":")).encode()}
    posts = {
        "/collective_rpc": b'{"results":[null]}',
        "/reset_prefix_cache": b'{"success":%s}' % (b"false" if args.prefix_cache_held else b"true"),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer(answers.get(self.path))

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
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
