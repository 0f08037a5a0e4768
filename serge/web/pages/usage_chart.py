"""Tokens per day as an SVG bar chart, drawn on the server: no script, no chart library, no CDN.

Each day is a bar of its prompt tokens with its generated tokens stacked on top, under a scale of
round numbers; every bar has a <title> (its day and counts) for a pointer and a screen reader. Days
with no use are drawn as gaps, so a week off looks like one. It only draws: the numbers come from
the usage ledger.
"""

from __future__ import annotations

from datetime import date, timedelta
from html import escape

from markupsafe import Markup

from serge.accounts.usage_report import UsageRow

WIDTH, HEIGHT = 720, 240
LEFT, BOTTOM, TOP = 64, 28, 12
MAX_BARS = 92  # a chart shows at most this many days: the last ones


def _round_top(peak: int) -> int:
    """The scale's top: the first of 1, 2, 5 x 10^n at or above `peak`."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if step * m >= peak:
                return step * m
        step *= 10


def _short(n: int) -> str:
    for size, unit in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:g}{unit}"
    return str(n)


def tokens_chart(rows: list[UsageRow], title: str = "Tokens per day (UTC)") -> Markup:
    """An <svg> of `rows` grouped by day (YYYY-MM-DD); empty days between the first and last drawn as gaps."""
    by_day = {date.fromisoformat(r.group): r for r in rows}
    if not by_day:
        return Markup(f'<svg class="usage-chart" role="img" viewBox="0 0 {WIDTH} 60" aria-label="{escape(title)}">'
                      f'<text x="{WIDTH // 2}" y="34" text-anchor="middle">No usage in these days.</text></svg>')
    last, first = max(by_day), min(by_day)
    first = max(first, last - timedelta(days=MAX_BARS - 1))
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    top = _round_top(max(by_day[d].total_tokens for d in days if d in by_day) or 1)
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    slot = plot_w / len(days)
    bar = max(1.0, slot * 0.8)
    y = lambda n: TOP + plot_h - plot_h * n / top  # noqa: E731
    parts = [f'<svg class="usage-chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg" '
             f'aria-label="{escape(title)}"><title>{escape(title)}</title>']
    for i in range(5):  # the scale: 0, top/4, ..., top
        value = top * i // 4
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - 8}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
                     f'<text class="axis" x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_short(value)}'
                     f'</text>')
    label_every = max(1, len(days) // 8)
    for i, day in enumerate(days):
        x = LEFT + i * slot + (slot - bar) / 2
        if (row := by_day.get(day)) is not None:
            tip = (f"{day}: {row.prompt_tokens:,} prompt + {row.completion_tokens:,} generated tokens, "
                   f"{row.requests:,} requests")
            parts.append(f'<g class="day"><title>{escape(tip)}</title>'
                         f'<rect class="prompt" x="{x:.1f}" y="{y(row.prompt_tokens):.1f}" width="{bar:.1f}" '
                         f'height="{y(0) - y(row.prompt_tokens):.1f}"/>'
                         f'<rect class="generated" x="{x:.1f}" y="{y(row.total_tokens):.1f}" width="{bar:.1f}" '
                         f'height="{y(row.prompt_tokens) - y(row.total_tokens):.1f}"/></g>')
        if i % label_every == 0 or i == len(days) - 1:
            parts.append(f'<text class="axis" x="{x + bar / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                         f'{day:%m-%d}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
