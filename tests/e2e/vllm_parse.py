"""Run vLLM's own server entry point on command lines, up to the engine's start, and save what it parsed.

    <serve python> tests/e2e/vllm_parse.py COMMANDS.json PARSED.json

COMMANDS.json holds a list of whole command lines as Baton builds them (coordinator/driver/vllm.py
`PolicyServer.command`: `env NAME=VALUE... <serve python> -m <module> <server args...>`). Each module is run
as `python -m` runs it (runpy, as `__main__`) with the command's assignments in the environment, so vLLM's
entry point builds its parser, parses, and validates the arguments exactly as at a real start; only
`run_server`, which would build the engine, is replaced by a stop that records the parsed namespace and the
engine arguments vLLM builds from it (`AsyncEngineArgs.from_cli_args`). PARSED.json gets one object per
command line, {"args": {...}, "engine": {...}} (the namespace's SERVER_FIELDS and ENGINE_FIELDS, the engine
arguments' ENGINE_FIELDS), or {"error": "..."} when vLLM refused it.
Runs in the serve environment (it imports vLLM); vLLM logs to stdout, so the results go to a file.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

#: the server's settings Baton chooses (coordinator/driver/vllm.py PolicyServer.args), as vLLM names them, and
#: one that vllm_config.extra_args passes in the tests (max_num_seqs)
SERVER_FIELDS = ("host", "port", "max_num_seqs")
#: the engine's settings Baton chooses per machine
ENGINE_FIELDS = (
    "model",
    "served_model_name",
    "max_model_len",
    "dtype",
    "generation_config",
    "tensor_parallel_size",
    "data_parallel_size",
    "gpu_memory_utilization",
    "enable_sleep_mode",
    "enforce_eager",
    "limit_mm_per_prompt",
    "allowed_local_media_path",
)


def split(command: list[str]) -> tuple[dict[str, str], list[str]]:
    """The environment assignments of `env NAME=VALUE... <python> <argv...>` and the interpreter's `argv`."""
    words = list(command)
    assigned: dict[str, str] = {}
    if words[:1] == ["env"]:
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("-"):
            name, _, value = words.pop(0).partition("=")
            assigned[name] = value
    return assigned, words[1:]


def parse(command: list[str]) -> dict:
    """Run `command` (`[env NAME=VALUE...] <python> -m <module> ...`) until vLLM would start its engine; return
    what it parsed."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server import entry

    assigned, argv = split(command)
    if argv[:1] != ["-m"] or len(argv) < 2:
        return {"error": f"not a `<python> -m <module>` command line: {command[:6]}"}
    seen: dict = {}

    async def stop_before_the_engine(args, **_kwargs) -> None:
        engine = AsyncEngineArgs.from_cli_args(args)
        seen["args"] = {name: getattr(args, name) for name in SERVER_FIELDS + ENGINE_FIELDS}
        seen["engine"] = {name: getattr(engine, name) for name in ENGINE_FIELDS}

    real, environ = entry.run_server, dict(os.environ)
    entry.run_server = stop_before_the_engine
    os.environ.update(assigned)
    sys.argv = [argv[1], *argv[2:]]
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # argparse refused the command line (its message is on stderr)
        return {"error": f"vLLM's parser exited {exc.code}"}
    except (ValueError, TypeError) as exc:  # validate_parsed_serve_args refused it
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        entry.run_server = real
        os.environ.clear()
        os.environ.update(environ)
    return seen or {"error": f"{argv[1]} returned without starting the server"}


def main() -> None:
    commands = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    results = [parse(argv) for argv in commands]
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
