"""Line charts as inline SVG (no library, no network): the dashboard's curves.

    chart = Chart("success rate (%)", [Series("train", [(0, 12.5), (1, 20.0)])], y_min=0, y_max=100)
    chart.svg()      # '<svg ...>...</svg>', to put in the page as it is

Points are (x, y) with x an iteration (or a training step); a series with one
point is drawn as a dot. Every label is escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

#: colours that read on white and for most colour-blind readers (Okabe-Ito)
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000")
WIDTH, HEIGHT = 420, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 28, 44  # margins in px: axis labels left and bottom, title on top


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]


@dataclass
class Chart:
    title: str
    series: list[Series] = field(default_factory=list)
    x_label: str = "iteration"
    y_min: float | None = None
    y_max: float | None = None

    def svg(self) -> str:
        drawn = [s for s in self.series if s.points]
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(self.title)}">'
            f'<text x="{LEFT}" y="16" class="title">{escape(self.title)}</text>'
        )
        if not drawn:
            middle = f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">no data yet</text>'
            return head + middle + "</svg>"
        xs = [x for s in drawn for x, _ in s.points]
        ys = [y for s in drawn for _, y in s.points]
        x0, x1 = min(xs), max(xs)
        pad = 0.1 * ((max(ys) - min(ys)) or abs(max(ys)) or 1.0)  # no point sits on the frame
        y0 = min(ys) - pad if self.y_min is None else self.y_min
        y1 = max(ys) + pad if self.y_max is None else self.y_max
        if x1 == x0:  # one iteration so far: it sits at the left edge of a unit-wide axis
            x1 = x0 + 1
        if y1 == y0:
            y0, y1 = y0 - 1, y1 + 1
        frame = _Frame(x0, x1, y0, y1)
        parts = [head, *frame.axes(self.x_label)]
        for index, series in enumerate(drawn):
            parts.append(frame.line(series, PALETTE[index % len(PALETTE)]))
        parts += _legend(drawn)
        return "".join(parts) + "</svg>"


@dataclass(frozen=True)
class _Frame:
    x0: float
    x1: float
    y0: float
    y1: float

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return HEIGHT - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)

    def axes(self, x_label: str) -> list[str]:
        parts = []
        marks = ticks(self.y0, self.y1)
        for y, label in zip(marks, tick_labels(marks), strict=True):
            py = self.py(y)
            parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" class="grid"/>')
            parts.append(f'<text x="{LEFT - 4}" y="{py + 4:.1f}" text-anchor="end">{label}</text>')
        for x in ticks(self.x0, self.x1, integer=True):
            px = self.px(x)
            parts.append(f'<text x="{px:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle">{number(x)}</text>')
        parts.append(
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - BOTTOM + 28}" text-anchor="middle" '
            f'class="axis">{escape(x_label)}</text>'
        )
        return parts

    def line(self, series: Series, colour: str) -> str:
        points = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in series.points)
        dots = "".join(
            f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="2.5" fill="{colour}">'
            f"<title>{escape(series.name)}: {number(x)}, {number(y)}</title></circle>"
            for x, y in series.points
        )
        return f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.8"/>{dots}'


def _legend(series: list[Series]) -> list[str]:
    parts, x = [], LEFT
    for index, s in enumerate(series):
        colour = PALETTE[index % len(PALETTE)]
        parts.append(f'<rect x="{x}" y="{HEIGHT - 11}" width="10" height="3" fill="{colour}"/>')
        parts.append(f'<text x="{x + 13}" y="{HEIGHT - 6}">{escape(s.name)}</text>')
        x += 22 + 7 * len(s.name)
    return parts


def ticks(low: float, high: float, integer: bool = False, count: int = 5) -> list[float]:
    """About `count` round tick values from low to high (whole numbers only with `integer`)."""
    raw = (high - low) / max(count - 1, 1)
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for factor in (1, 2, 2.5, 5, 10):
        if step * factor >= raw:
            step *= factor
            break
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def tick_labels(values: list[float]) -> list[str]:
    """One label a tick, with as many decimals as their step needs (2.415, 2.420, 2.425: `number`'s three
    significant digits would make all three 2.42)."""
    if len(values) < 2 or max(abs(v) for v in values) >= 10000:
        return [number(v) for v in values]
    step = abs(values[1] - values[0])
    exponent = math.floor(math.log10(step))
    decimals = max(0, -exponent + (0 if round(step / 10**exponent, 6).is_integer() else 1))
    return [f"{v:.{decimals}f}" for v in values]


def number(value: float) -> str:
    """A short label: 3, 2.5, 0.125, 1.2k."""
    if abs(value) >= 10000:
        return f"{value / 1000:.0f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"
