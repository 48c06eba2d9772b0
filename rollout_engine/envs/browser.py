"""One headless Chromium per engine, one browser context per slot (Playwright, async API).

`BrowserPool.start()` launches the browser once; `slot(i)` gives slot i's
context and page, created on first use and reused by every later episode of
that slot, so the number of slots the engine uses (`env_config.server_size`)
is the pool size, as in WebGym. `discard(i)` drops a broken slot (the next
`slot(i)` builds a fresh one). `close()` closes contexts, browser and the
Playwright driver; if the browser process is still alive after that, its
process group (recorded at launch) is killed, so no Chromium outlives the engine.

Playwright cannot download browsers here: the binary is `BATON_CHROMIUM`, else
/usr/lib/chromium/chromium, else /usr/bin/chromium (`find_chromium`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
#: seconds each shutdown step may take before the next, harder one
CLOSE_TIMEOUT_S = 10.0


def find_chromium(explicit: str = "") -> str | None:
    """The Chromium binary: `explicit` if given, else `$BATON_CHROMIUM` if set, else the Debian paths.

    A binary named explicitly (argument or variable) that is not executable gives None, never a fallback.
    """
    named = explicit or os.environ.get("BATON_CHROMIUM", "")
    for candidate in (named,) if named else CHROMIUM_CANDIDATES:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class BrowserSlot:
    """One slot's context and page; `url` is the page currently loaded."""

    context: Any
    page: Any
    url: str = ""


class BrowserPool:
    """A Chromium browser and its per-slot contexts."""

    def __init__(self, executable: str, viewport: tuple[int, int] = (500, 300), headless: bool = True) -> None:
        self.executable = executable
        self.viewport = {"width": viewport[0], "height": viewport[1]}
        self.headless = headless
        self.browser_pid: int | None = None
        self._playwright: Any = None
        self._browser: Any = None
        self._slots: dict[int, BrowserSlot] = {}

    async def start(self) -> None:
        from playwright.async_api import async_playwright  # imported here: only browser envs need it

        self._playwright = await async_playwright().start()
        self._browser = await self._playwright.chromium.launch(
            executable_path=self.executable, headless=self.headless, args=list(CHROMIUM_FLAGS)
        )
        self.browser_pid = await self._find_pid()
        log.info("started Chromium %s (pid %s)", self.executable, self.browser_pid)

    async def slot(self, index: int) -> BrowserSlot:
        """Slot `index`'s context and page, created on first use."""
        if self._browser is None:
            raise RuntimeError("BrowserPool.start() was not called")
        found = self._slots.get(index)
        if found is None or found.page.is_closed():
            context = await self._browser.new_context(viewport=self.viewport)
            found = BrowserSlot(context=context, page=await context.new_page())
            self._slots[index] = found
        return found

    async def discard(self, index: int) -> None:
        """Close slot `index` (after an error) so the next episode gets a fresh context."""
        found = self._slots.pop(index, None)
        if found is not None:
            await _quietly(found.context.close(), "closing a browser context")

    @property
    def size(self) -> int:
        return len(self._slots)

    async def close(self) -> None:
        """Close everything; safe to call twice and after a failed start."""
        for index in list(self._slots):
            await self.discard(index)
        if self._browser is not None:
            await _quietly(self._browser.close(), "closing Chromium")
            self._browser = None
        if self._playwright is not None:
            await _quietly(self._playwright.stop(), "stopping the Playwright driver")
            self._playwright = None
        self._kill_leftover()

    async def _find_pid(self) -> int | None:
        try:
            session = await self._browser.new_browser_cdp_session()
            info = await session.send("SystemInfo.getProcessInfo")
            await session.detach()
        except Exception as exc:  # the pid is a safety net only; a browser without it still works
            log.warning("could not read the Chromium pid: %s", exc)
            return None
        return next((int(p["id"]) for p in info.get("processInfo", []) if p.get("type") == "browser"), None)

    def _kill_leftover(self) -> None:
        pid, self.browser_pid = self.browser_pid, None
        if pid is None:
            return
        try:
            if os.getpgid(pid) == pid:  # Playwright starts Chromium as a process-group leader
                os.killpg(pid, signal.SIGKILL)
                log.warning("Chromium (pid %s) outlived close(); killed its process group", pid)
        except ProcessLookupError:
            return


async def _quietly(awaitable: Any, what: str) -> None:
    try:
        await asyncio.wait_for(awaitable, CLOSE_TIMEOUT_S)
    except Exception as exc:  # shutdown goes on: the next, harder step follows
        log.warning("%s failed: %s", what, exc)
