"""Figure data -> one self-contained HTML page (pure: strings in, a string out).

Charts are hand-written inline SVG: no script, no font, no stylesheet from
anywhere, so the page shows the same offline, in a mail attachment or from
S3. Every chart is a `<figure class="chart">` holding one `<svg
class="plot">`, or, when there is nothing to draw, a `<p class="empty">`
saying why (the page's test finds each by these classes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ops.report.figures import Breakdown, Figures, Histogram, LengthRow, Series

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2",
           "#97bbf5", "#9c6b4e", "#9498a0")
CAP_COLOR = "#d62728"
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def fmt(value: float) -> str:
    """A number for an axis or a label: 1,234 / 12.5k / 3.1M / 0.25."""
    if value != value:  # NaN
        return "-"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps up to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(math.ceil(top / step - 1e-9)) + 1)]


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11,
          fill: str = "#333", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}"{extra}>{escape(text)}</text>')


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(label)}" style="{FONT}">' + "".join(body) + "</svg>")


def histogram_svg(h: Histogram, label: str, markers: Sequence[tuple[float, str]] = (),
                  width: int = 420, height: int = 200, fill: str = PALETTE[0]) -> str:
    """Vertical bars over the bins; `markers` are dashed lines at x values."""
    left, right, top, bottom = 44, 12, 18, 32
    plot_w, plot_h = width - left - right, height - top - bottom
    x_max = h.edges[-1] if h.edges[-1] > h.edges[0] else 1.0
    ticks = nice_ticks(max(h.counts, default=0) or 1, 4)
    y_top = ticks[-1]

    def x(v: float) -> float:
        return left + plot_w * (v - h.edges[0]) / (x_max - h.edges[0])

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_top)

    body = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>']
    for t in ticks:
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                    'stroke="#e5e5e5"/>')
        body.append(_text(left - 4, y(t) + 4, fmt(t), "end", 10, "#666"))
    for i, count in enumerate(h.counts):
        if count:
            x0, x1 = x(h.edges[i]), x(h.edges[i + 1])
            body.append(f'<rect x="{x0 + 0.5:.1f}" y="{y(count):.1f}" '
                        f'width="{max(x1 - x0 - 1, 1):.1f}" height="{y(0) - y(count):.1f}" '
                        f'fill="{fill}"><title>{escape(fmt(h.edges[i]))}-'
                        f'{escape(fmt(h.edges[i + 1]))}: {count:,}</title></rect>')
    body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
                'stroke="#999"/>')
    for t in nice_ticks(x_max - h.edges[0], 5):
        v = h.edges[0] + t
        if v <= x_max + 1e-9:
            body.append(_text(x(v), height - bottom + 14, fmt(v), "middle", 10, "#666"))
    for value, name in markers:
        if h.edges[0] <= value <= x_max:
            body.append(f'<line x1="{x(value):.1f}" x2="{x(value):.1f}" y1="{top}" '
                        f'y2="{y(0):.1f}" stroke="{CAP_COLOR}" stroke-width="1.5" '
                        'stroke-dasharray="4 3"/>')
            body.append(_text(x(value), top - 5, name, "end", 10, CAP_COLOR))
    body.append(_text(left + plot_w / 2, height - 4, label, "middle", 10, "#666"))
    return _svg(width, height, body, label)


def shares_svg(b: Breakdown, width: int = 640) -> str:
    """One horizontal bar per row, split by key in proportion, with its count."""
    label_w, count_w, row_h, legend_h = 170, 60, 22, 22 * math.ceil(len(b.keys) / 3)
    height = legend_h + 8 + row_h * len(b.rows) + 6
    plot_w = width - label_w - count_w
    colors = {k: color(i) for i, k in enumerate(b.keys)}
    body = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>']
    for i, key in enumerate(b.keys):
        lx, ly = label_w + (i % 3) * (plot_w // 3), 6 + 22 * (i // 3)
        body.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colors[key]}"/>')
        body.append(_text(lx + 16, ly + 10, _short(key, 24), size=11))
    for r, (name, counts) in enumerate(b.rows):
        y0 = legend_h + 8 + r * row_h
        total = sum(counts.values())
        body.append(_text(label_w - 6, y0 + 14, _short(name, 26), "end"))
        x0 = float(label_w)
        for key in b.keys:
            n = counts.get(key, 0)
            if not n:
                continue
            w = plot_w * n / total
            body.append(f'<rect x="{x0:.1f}" y="{y0 + 2}" width="{max(w, 0.5):.1f}" '
                        f'height="{row_h - 5}" fill="{colors[key]}"><title>{escape(name)}, '
                        f'{escape(key)}: {n:,} ({100 * n / total:.1f}%)</title></rect>')
            if w > 34:
                body.append(_text(x0 + w / 2, y0 + 15, f"{100 * n / total:.0f}%", "middle",
                                  10, "#fff"))
            x0 += w
        body.append(_text(width - 4, y0 + 14, f"{total:,}", "end", 11, "#555"))
    return _svg(width, height, body, f"by {b.by}")


def hbars_svg(items: Sequence[tuple[str, float, str]], width: int = 640) -> str:
    """One bar per (label, value, text)."""
    label_w, text_w, row_h = 150, 150, 22
    height = row_h * len(items) + 8
    top = max((v for _, v, _ in items), default=1.0) or 1.0
    plot_w = width - label_w - text_w
    body = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>']
    for r, (name, value, text) in enumerate(items):
        y0 = 4 + r * row_h
        body.append(_text(label_w - 6, y0 + 14, _short(name, 22), "end"))
        body.append(f'<rect x="{label_w}" y="{y0 + 2}" width="{max(plot_w * value / top, 1):.1f}"'
                    f' height="{row_h - 5}" fill="{color(r)}"/>')
        body.append(_text(label_w + plot_w * value / top + 6, y0 + 14, text, size=11))
    return _svg(width, height, body, "bars")


def lines_svg(series: Sequence[Series], y_label: str, width: int = 640, height: int = 280,
              dashed: Sequence[bool] = ()) -> str:
    """Lines over seconds since the start (the axis in minutes when long)."""
    left, right, top, bottom, legend = 56, 16, 8 + 16 * math.ceil(len(series) / 3), 34, 16
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [p[0] for s in series for p in s.points] or [0.0, 1.0]
    ys = [p[1] for s in series for p in s.points] or [1.0]
    x_lo, x_hi = min(0.0, min(xs)), max(xs) if max(xs) > min(0.0, min(xs)) else 1.0
    minutes = x_hi > 300
    scale = 60.0 if minutes else 1.0
    y_ticks = nice_ticks(max(ys) or 1.0, 5)
    x_ticks = nice_ticks((x_hi - x_lo) / scale, 6)

    def x(v: float) -> float:
        return left + plot_w * (v - x_lo) / (x_hi - x_lo)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_ticks[-1])

    body = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>']
    for t in y_ticks:
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                    'stroke="#e5e5e5"/>')
        body.append(_text(left - 4, y(t) + 4, fmt(t), "end", 10, "#666"))
    for t in x_ticks:
        v = x_lo + t * scale
        if v <= x_hi + 1e-9:
            body.append(_text(x(v), height - bottom + 14, fmt(t), "middle", 10, "#666"))
    body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
                'stroke="#999"/>')
    for i, s in enumerate(series):
        c = color(i)
        dash = ' stroke-dasharray="6 4"' if i < len(dashed) and dashed[i] else ""
        if len(s.points) == 1:
            px, py = s.points[0]
            body.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="3" fill="{c}"/>')
        elif s.points:
            path = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in s.points)
            body.append(f'<polyline points="{path}" fill="none" stroke="{c}" '
                        f'stroke-width="2"{dash}/>')
        lx = left + (i % 3) * (plot_w // 3)
        ly = 6 + legend * (i // 3)
        body.append(f'<rect x="{lx}" y="{ly + 3}" width="12" height="3" fill="{c}"/>')
        body.append(_text(lx + 16, ly + 6, _short(s.name, 26), size=11))
    body.append(_text(left + plot_w / 2, height - 4,
                      f"{'minutes' if minutes else 'seconds'} since the run started", "middle",
                      10, "#666"))
    body.append(_text(12, top + plot_h / 2, y_label, "middle", 10, "#666",
                      f' transform="rotate(-90 12 {top + plot_h / 2:.1f})"'))
    return _svg(width, height, body, y_label)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# -- the page ------------------------------------------------------------------


def chart(chart_id: str, title: str, svg: str | None, empty: str, note: str = "") -> str:
    """A chart, or the sentence saying why there is none."""
    inner = svg if svg is not None else f'<p class="empty">{escape(empty)}</p>'
    extra = f'<p class="note">{escape(note)}</p>' if note else ""
    return (f'<figure class="chart" id="{chart_id}"><figcaption>{escape(title)}</figcaption>'
            f"{inner}{extra}</figure>")


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def length_charts(f: Figures) -> list[str]:
    markers = [(float(cap), f"max_tokens {cap:,}") for cap in f.max_tokens]
    if not f.lengths:
        return [chart("lengths", "Output length by category", None,
                      "No answers: no output lengths to show.")]
    out = []
    for i, row in enumerate(f.lengths):
        out.append(chart(f"lengths-{i}", _length_title(row),
                         histogram_svg(row.histogram, "output tokens", markers,
                                       fill=color(i)), ""))
    return out


def _length_title(row: LengthRow) -> str:
    return (f"{row.category}: {row.answers:,} answers, {row.truncated:,} truncated at "
            f"max_tokens ({_pct(row.truncated, row.answers)})")


def _breakdown(chart_id: str, title: str, b: Breakdown, empty: str) -> str:
    return chart(chart_id, title, shares_svg(b) if b.rows else None, empty)


def render(f: Figures) -> str:
    """The whole page."""
    t = f.timeline
    sections: list[tuple[str, list[str]]] = [
        ("Output lengths", length_charts(f)),
        ("How answers ended", [
            _breakdown("finish-category", "Finish reasons by category", f.finish_by_category,
                       "No results."),
            _breakdown("finish-source", "Finish reasons by source", f.finish_by_source,
                       "No results."),
            _breakdown("dlq-category", "Dead-letter reasons by category", f.dlq_by_category,
                       "No dead letters: every result was accepted."),
            _breakdown("dlq-source", "Dead-letter reasons by source", f.dlq_by_source,
                       "No dead letters: every result was accepted."),
            _breakdown("thinking", "Thinking (reasoning) present or absent, by category",
                       f.thinking, "No answers."),
        ]),
        ("Speculative decoding", [
            chart("accept", "Accept length per request",
                  histogram_svg(f.accept_lengths, "accepted tokens per verify step")
                  if f.accept_lengths else None,
                  "No speculative decoding stats: no request reported an accept length."),
            chart("accept-gpu", "Accept length per GPU (weighted by output tokens)",
                  hbars_svg([(g.instance, g.mean, f"{g.mean:.2f} over {fmt(g.tokens)} tokens")
                             for g in f.accept_by_gpu]) if f.accept_by_gpu else None,
                  "No speculative decoding stats."),
        ]),
        ("Throughput", [
            chart("throughput", "Output tokens/s per GPU",
                  lines_svg(t.throughput, "output tokens/s")
                  if any(len(s.points) for s in t.throughput) else None,
                  t.left_out or "No throughput to show: the progress records hold fewer than "
                  "two commits of any worker.",
                  f"from {t.snapshots:,} progress records" if t.snapshots else ""),
            chart("progress", "Answers so far against the plan",
                  lines_svg(t.progress, "answers",
                            dashed=[s.name.endswith(" plan") for s in t.progress])
                  if any(s.points for s in t.progress) else None,
                  t.left_out or "No progress records of any worker.",
                  "" if t.planned or t.left_out or not t.progress else
                  "no prediction: the run was produced without --plan or --estimate-rps"),
        ]),
        ("Conversations", [
            chart("turns", "User turns answered per conversation",
                  histogram_svg(f.turns, "turns (the last bin: 19 and more)")
                  if f.turns else None, "No conversations (not a regenerate-turns run)."),
            chart("tool-rounds", "Tool-calling steps per conversation",
                  histogram_svg(f.tool_rounds, "steps that called tools", fill=PALETTE[2])
                  if f.tool_rounds else None, "No conversations (not a regenerate-turns run)."),
        ]),
    ]
    head = (f"{f.records:,} results: {f.accepted:,} accepted (S3), {f.dead_letters:,} "
            f"dead-lettered ({_pct(f.dead_letters, f.records)}); runs "
            f"{', '.join(f.runs)}; max_tokens {', '.join(f'{c:,}' for c in f.max_tokens)}")
    notes = list(f.notes)
    if not f.records:
        notes.insert(0, "This run has no results yet: no record in S3 and none in the "
                        "dead-letter topic.")
    elif not f.accepted:
        notes.insert(0, "Every result of this run is in the dead-letter topic: nothing was "
                        "accepted.")
    body = [f"<h1>{escape(f.title)}</h1>", f'<p class="summary">{escape(head)}</p>']
    body += [f'<p class="warning">{escape(n)}</p>' for n in notes]
    for name, charts in sections:
        body.append(f"<section><h2>{escape(name)}</h2>{''.join(charts)}</section>")
    body.append('<p class="foot">The numbers of every chart: report.json, beside this '
                "page.</p>")
    return PAGE.format(title=escape(f.title), body="\n".join(body))


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #222; background: #fafafa; max-width: 1800px; }}
h1 {{ font-size: 22px; margin: 0 0 6px; }}
h2 {{ font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #ddd; }}
section {{ display: flex; flex-wrap: wrap; gap: 14px; }}
section h2 {{ flex-basis: 100%; }}
figure.chart {{ margin: 0; padding: 10px; background: #fff; border: 1px solid #e2e2e2;
               border-radius: 6px; }}
figcaption {{ font-size: 13px; font-weight: 600; margin-bottom: 6px; }}
p.empty {{ color: #777; font-style: italic; margin: 18px 8px; max-width: 520px; }}
p.note {{ color: #777; font-size: 12px; margin: 4px 0 0; }}
p.summary {{ margin: 0 0 8px; }}
p.warning {{ background: #fff4d6; border: 1px solid #f0c36d; padding: 8px 12px;
            border-radius: 4px; }}
p.foot {{ color: #777; font-size: 12px; margin-top: 24px; }}
</style></head>
<body>
{body}
</body></html>
"""
