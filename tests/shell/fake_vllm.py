"""A stand-in for vLLM's OpenAI server in the shell tests: answers /health and /v1/models, nothing else.

python fake_vllm.py --port 8999 --served-model-name policy --model /data/models/m
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
    args = parser.parse_args()
    # compact, as vLLM answers: vllm_serves matches "id":"<name>" and "root":"<model>"
    models = {"object": "list", "data": [{"id": args.served_model_name, "object": "model", "root": args.model}]}
    answers = {"/health": b"", "/v1/models": json.dumps(models, separators=(",", ":")).encode()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
