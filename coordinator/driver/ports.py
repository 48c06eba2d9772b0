"""The torchrun master's port: a free one outside the kernel's ephemeral range (a multi-node run's master chooses
it once at its start, a single node at each update).

free_port(avoid={vllm_port})   # -> e.g. 22714
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

#: the master's torchrun port is drawn from this many ports below (or above) the kernel's ephemeral range ...
PORT_SPAN = 10000
#: ... trying at most this many
PORT_TRIES = 200
#: ... never torch's defaults (another job's torchrun may take them later)
TORCH_PORTS = frozenset({29400, 29500})


def free_port(avoid: Collection[int] = ()) -> int:
    """The master's torchrun port: a free TCP port outside the kernel's ephemeral range (a random one of the
    PORT_SPAN ports below it, else above it, never one of `avoid` (this node's vLLM port) nor torch's defaults;
    any free port when none is free there). The run binds it at every training, maybe hours after it picked it,
    and a port of the ephemeral range may by then be the source port of any connection this host made (a
    rollout's, a judge's, another program's): in use, or in TIME_WAIT for a minute after it closed. Either makes
    torchrun's listen fail with EADDRINUSE, and that update with it."""
    low, high = ephemeral_range()
    outside = [*range(max(1024, low - PORT_SPAN), low), *range(high + 1, min(65536, high + 1 + PORT_SPAN))]
    for port in random.sample(outside, min(len(outside), PORT_TRIES)):
        if port not in TORCH_PORTS and port not in avoid and bindable(port):
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives a connection's local end (`ip_local_port_range`; Linux's default without it)."""
    try:
        low, high = (int(word) for word in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def bindable(port: int) -> bool:
    """No socket of this host holds `port` (listening, connected or in TIME_WAIT): a listen on every address
    without SO_REUSEADDR, as torchrun's store listens, would succeed now."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True
