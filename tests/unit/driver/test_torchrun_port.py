"""The master's torchrun port (coordinator/driver/ports.py free_port): outside the kernel's ephemeral range.

Issue 24's soak, round 7 (docs/reliability.md, "Several nodes"): the master picked port 41733 at its start (a
port of the ephemeral range, 32768-60999 there) and its training of iteration 9 could not listen on it
(`DistNetworkError: ... port: 41733 ... EADDRINUSE`): a socket of the host held it by then. A port the kernel
hands out as a connection's local end is held while the connection lives and for a minute of TIME_WAIT after
it closed, and torchrun's store listens without SO_REUSEADDR, so such a socket alone fails the update.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from coordinator.driver import ports
from coordinator.driver.ports import bindable, ephemeral_range, free_port


def test_the_torchrun_port_is_outside_the_ephemeral_range_and_free() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high and 1024 <= port <= 65535 and port not in ports.TORCH_PORTS
        assert bindable(port)


@pytest.fixture
def time_wait_port() -> Iterator[int]:
    """A port below the ephemeral range left in TIME_WAIT by a connection from it that this end closed first
    (what a finished HTTP request leaves on the port the kernel gave it)."""
    low, _ = ephemeral_range()
    port = next(p for p in range(low - 1, low - 2000, -1) if bindable(p))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.socket()
        client.bind(("127.0.0.1", port))
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        client.close()  # the active close: the client's end goes to TIME_WAIT
        accepted.close()
    yield port


def test_a_port_in_time_wait_is_not_bindable_and_never_the_torchrun_port(
    time_wait_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as torchrun's store listens: every address, no SO_REUSEADDR
    with socket.socket() as listener, pytest.raises(OSError):
        listener.bind(("", time_wait_port))
    assert not bindable(time_wait_port)
    # the draw offers the held port first: free_port takes the next one
    monkeypatch.setattr(random, "sample", lambda ports, k: [time_wait_port, *[p for p in ports if p != time_wait_port]])
    port = free_port()
    assert port != time_wait_port and bindable(port)


def test_without_room_outside_the_range_any_free_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    assert 1024 <= free_port() <= 65535


def test_never_the_node_s_own_vllm_port(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = ephemeral_range()
    vllm = next(p for p in range(low - 1, low - 2000, -1) if bindable(p))  # not started yet: free
    monkeypatch.setattr(random, "sample", lambda ports, k: [vllm, *[p for p in ports if p != vllm]])
    assert free_port() == vllm and free_port(avoid={vllm}) != vllm
