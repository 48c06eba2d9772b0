"""The model server of a benchmark: a running one (--base-url) or our own vLLM.

`serve(args)` is a context manager yielding the OpenAI base URL. Without
`--base-url` it prepares the data path with `scripts/prepare.sh` (default
model under `<data>/models/SmolLM2-135M-Instruct`), starts vLLM through the
product's driver (coordinator/driver/vllm.py: `PolicyServer.start` records the
server's process group under a run directory) and stops exactly that group on
exit, SIGINT and SIGTERM included.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from coordinator.driver import say
from coordinator.driver.procs import Groups
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import for_node
from rollout_engine.config import VllmConfig

REPO = Path(__file__).resolve().parents[1]
MODEL = "models/SmolLM2-135M-Instruct"

logger = logging.getLogger(__name__)
#: the HTTP clients' loggers, each request a line at INFO (httpx2: the client the registry's openai package uses)
HTTP_LOGGERS = ("httpx", "httpx2")


def quiet_http_logs() -> None:
    """Keep the HTTP clients' per-request lines out of a benchmark's INFO log."""
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def bench_logging(fmt: str = "%(asctime)s %(name)s: %(message)s") -> None:
    """A benchmark's progress at INFO on stderr (stdout keeps its results), without a line per HTTP request."""
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stderr)
    quiet_http_logs()


def own_servers_only(args: argparse.Namespace, prog: str, what: str = "its own vLLM") -> None:
    """A benchmark that compares vLLM's settings starts every server itself: refuse --base-url."""
    if args.base_url:
        raise SystemExit(f"{prog} starts {what}; drop --base-url")


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="", help="use this running OpenAI server (…/v1) instead of starting vLLM")
    parser.add_argument("--model", default="policy", help="served model name (default: policy)")
    parser.add_argument(
        "--data-path",
        type=Path,
        default=Path.home() / ".cache" / "baton" / "bench-data",
        help="data path prepared with scripts/prepare.sh (default: ~/.cache/baton/bench-data)",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="where vLLM's log and pid go (default: a temp dir)")


def env_python(name: str) -> str:
    """Environment `name`'s interpreter (app, serve, train): BATON_<NAME>_PY (envs_export), else the one envs.sh
    names."""
    if os.environ.get(f"BATON_{name.upper()}_PY"):
        return os.environ[f"BATON_{name.upper()}_PY"]
    script = f'source scripts/lib/common.sh; source scripts/lib/envs.sh; envs_python "{name}"'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, text=True, check=False, stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise SystemExit(f"the {name} environment is not set up (message above); run: bash scripts/setup.sh")
    return out.stdout.strip()


def prepare_data(data_path: Path) -> Path:
    """Run scripts/prepare.sh (skips what is present); return the default model's folder."""
    data_path = data_path.resolve()
    logger.info("preparing %s (scripts/prepare.sh)", data_path)
    out = subprocess.run(
        ["bash", str(REPO / "scripts/prepare.sh"), "--data-path", str(data_path)],
        cwd=REPO,
        check=False,
        stdout=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        raise SystemExit(f"scripts/prepare.sh --data-path {data_path} failed (exit {out.returncode}); see above")
    return data_path / MODEL


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def serve(args: argparse.Namespace, extra_args: tuple[str, ...] = (), model_dir: Path | None = None) -> Iterator[str]:
    """Yield the base URL of the server to benchmark; stop the one we started, whatever happens. `extra_args`:
    vllm_config.extra_args of our vLLM (run.sh's defaults for everything else); `model_dir`: the model, when
    prepare_data has given it already."""
    if args.base_url:
        yield args.base_url.rstrip("/")
        return
    model_dir = model_dir or prepare_data(args.data_path)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="baton-bench-"))
    port = free_port()
    server = PolicyServer(run_dir, port, args.model, Groups(run_dir), Supervisor(), env_python("serve"))
    if extra_args:
        server.settings = for_node(VllmConfig(allowed_local_media_path="", extra_args=list(extra_args)), model_dir, "")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        logger.info("starting vLLM on port %d (log: %s)", port, server.log)
        try:
            server.start(str(model_dir), deadline_s=600)
        except say.Ended as exc:
            raise SystemExit(f"vLLM did not start (exit {exc.code}: {exc.message}); see {server.log}") from exc
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        logger.info("stopping the vLLM we started (process group in %s/groups.json)", run_dir)
        server.stop()
        signal.signal(signal.SIGTERM, previous)
