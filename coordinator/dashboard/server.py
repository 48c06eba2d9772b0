"""The dashboard's HTTP server (standard library only) and its `dashboard` subcommand.

    python -m coordinator dashboard --log-path L [--port 8080] [--host 127.0.0.1]

Routes: `/` the page; `/api/state[?split=S&iteration=N]` the snapshot
(dashboard.state); `/api/episode?split=S&iteration=N&id=E` one episode's
turns; `/files/<path>` a file under the log path (screenshots), refused (404)
when the path resolves outside it. Every request reads the log path anew and
writes nothing. SIGTERM or SIGINT stops the server (exit 0). It binds
127.0.0.1 unless told otherwise: reach it from elsewhere through an SSH tunnel
(docs/observability.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import mimetypes
import signal
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from coordinator.dashboard.page import render_page
from coordinator.dashboard.state import Board
from rollout_engine.exits import Exit

log = logging.getLogger(__name__)
SPLITS = ("train", "test")


def safe_file(log_path: Path, relative: str) -> Path | None:
    """The file `relative` names under the log path, or None when it is not a file inside it (.., symlinks out)."""
    root = log_path.resolve()
    if not relative or "\0" in relative:
        return None
    try:
        target = (root / unquote(relative).lstrip("/")).resolve()
    except (OSError, ValueError):
        return None
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return target


def chosen_rollout(query: dict[str, list[str]]) -> tuple[str, int] | None:
    """(split, iteration) from ?split=&iteration=, or None when absent or malformed."""
    split, iteration = query.get("split", [""])[0], query.get("iteration", [""])[0]
    if split in SPLITS and iteration.isdigit():
        return split, int(iteration)
    return None


class Handler(BaseHTTPRequestHandler):
    """Answers GET requests from one Board (set on the server as `board`)."""

    server: DashboardServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        board = self.server.board
        if url.path in ("/", "/index.html"):
            self.send(HTTPStatus.OK, render_page(str(board.log)).encode(), "text/html; charset=utf-8")
        elif url.path == "/api/state":
            self.send_json(board.snapshot(chosen_rollout(query)))
        elif url.path == "/api/episode":
            chosen = chosen_rollout(query)
            episode_id = query.get("id", [""])[0]
            found = board.episode(*chosen, episode_id) if chosen and episode_id else None
            if found is None:
                self.send(HTTPStatus.NOT_FOUND, b"no such episode in the journals\n", "text/plain")
            else:
                self.send_json(found)
        elif url.path.startswith("/files/"):
            path = safe_file(board.log, url.path.removeprefix("/files/"))
            if path is None:
                self.send(HTTPStatus.NOT_FOUND, b"not a file under the log path\n", "text/plain")
            else:
                kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                self.send(HTTPStatus.OK, path.read_bytes(), kind)
        else:
            self.send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def send_json(self, data: Any) -> None:
        self.send(HTTPStatus.OK, json.dumps(data, default=str).encode(), "application/json")

    def send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True  # a slow page load never holds up the stop

    def __init__(self, address: tuple[str, int], board: Board) -> None:
        self.board = board
        super().__init__(address, Handler)


def run_dashboard(log_path: Path, host: str, port: int) -> int:
    """Serve until SIGTERM or SIGINT; 1 when the address cannot be bound."""
    try:
        server = DashboardServer((host, port), Board(log_path))
    except OSError as exc:
        print(
            f"[baton] error: the dashboard cannot listen on {host}:{port} ({exc}); choose another port", file=sys.stderr
        )
        return Exit.FAILED

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    bound_host, bound_port = server.server_address[:2]
    print(f"[baton] dashboard: http://{bound_host}:{bound_port}/ (log path {log_path})", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("[baton] dashboard: stopped", file=sys.stderr, flush=True)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        print(f"[baton] error: --port must be in 0..65535 (got {args.port}); 0 picks a free one", file=sys.stderr)
        return Exit.BAD_INPUT
    log_path = Path(args.log_path)
    if not log_path.is_dir():
        print(
            f"[baton] warning: {log_path} is not a directory yet; the page fills in when the run writes it",
            file=sys.stderr,
        )
    return run_dashboard(log_path, args.host, args.port)


def add_subcommand(sub: Any) -> None:
    """Register `dashboard` on the subparsers of `python -m coordinator`."""
    parser = sub.add_parser("dashboard", help="serve the run's web page (read-only), until SIGTERM")
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--port", type=int, default=8080, help="0: a free port (printed on stderr)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this host only)")
    parser.set_defaults(func=cmd_dashboard)
