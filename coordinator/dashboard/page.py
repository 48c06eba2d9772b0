"""The dashboard's HTML: one self-contained page (page.css and page.js inlined, nothing fetched from elsewhere).

The script polls `/api/state` every `POLL_MS` and redraws the run, its
trouble, the episode grid, the iteration table and the curves (SVG drawn by the
server); clicking a cell fetches `/api/episode` and shows its turns and
screenshots (`/files/<path under the log path>`). Text from the run (model
replies, task names) is only ever set as text, never parsed as HTML.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

POLL_MS = 2000

HERE = Path(__file__).parent


def render_page(log_path: str) -> str:
    """The whole page; the data arrive from /api/state once the script runs."""
    style = (HERE / "page.css").read_text()
    script = f"const POLL_MS = {POLL_MS};\n" + (HERE / "page.js").read_text()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Baton: {escape(log_path)}</title><link rel="icon" href="data:,">
<style>{style}</style></head>
<body><header><h1>Baton run</h1><span class="path">{escape(log_path)}</span>
<span id="updated" class="muted"></span></header>
<main>
<section id="troubles"></section>
<section id="run"></section>
<section id="rollouts"></section>
<section id="grid"></section>
<section id="episode"><h2>Episode</h2><p class="muted">click a cell of the grid to read its turns</p></section>
<section id="iterations"></section>
<section id="charts"></section>
</main>
<script>{script}</script></body></html>
"""
