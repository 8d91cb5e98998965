"""One self-contained HTML page from figures and text: plotly.js inlined once (its offline bundle, no network at
view time), each chart with PNG and SVG download buttons (Plotly.downloadImage renders in the page, offline).

After drawing, the page records what each chart drew in `window.autoplanCharts` (chart id -> trace name -> marks),
so a test or a reader's console can check that every chart rendered its bars and points."""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import List, Sequence

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs


@dataclass(frozen=True)
class Section:
    """A titled part of the page: charts (id, figure) shown side by side when `columns` > 1, and text items."""

    title: str
    charts: Sequence[tuple] = ()
    items: Sequence[str] = ()  # plain text, escaped
    table: Sequence[Sequence[str]] = ()  # first row = header
    columns: int = 1
    note: str = ""


@dataclass(frozen=True)
class Page:
    title: str
    subtitle: str
    sections: List[Section] = field(default_factory=list)


CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 17px; margin: 28px 0 6px 0; }
.sub { color: #555; margin-bottom: 12px; } .note { color: #555; font-size: 13px; }
.grid { display: grid; gap: 12px; } .chart { border: 1px solid #eee; padding: 4px; }
.export { font-size: 12px; margin: 2px 0 0 4px; } .export button { font-size: 12px; margin-right: 6px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f5f5f5; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
ul { margin: 4px 0; padding-left: 20px; font-size: 14px; }
"""

# Draw every figure, then count each trace's marks as rendered in the SVG into window.autoplanCharts: bars and
# scatter points, and a drawn line as one mark.
SCRIPT = """
(function () {
  var figures = %s;
  var config = {displaylogo: false, responsive: true, displayModeBar: 'hover',
                toImageButtonOptions: {format: 'png', scale: 2}};
  window.autoplanCharts = {};
  function count(gd) {
    var out = {};
    gd.querySelectorAll('g.trace').forEach(function (g) {
      var d = g.__data__, name = d && d[0] && d[0].trace ? d[0].trace.name : null;
      if (name === null) return;
      var n = g.querySelectorAll('g.point path, path.point').length;
      g.querySelectorAll('path.js-line').forEach(function (p) { if (p.getAttribute('d')) n += 1; });
      out[name] = (out[name] || 0) + n;
    });
    return out;
  }
  var pending = Object.keys(figures).map(function (id) {
    var f = figures[id];
    return Plotly.newPlot(id, f.data, f.layout, config).then(function (gd) {
      window.autoplanCharts[id] = count(gd);
    });
  });
  Promise.all(pending).then(function () { document.body.setAttribute('data-charts-drawn', 'true'); });
  window.autoplanExport = function (id, format) {
    Plotly.downloadImage(document.getElementById(id), {format: format, filename: id, scale: 2});
  };
})();
"""


def _chart(chart_id: str) -> str:
    return (f'<div class="chart"><div id="{chart_id}"></div><div class="export">'
            f'<button onclick="autoplanExport(\'{chart_id}\', \'png\')">PNG</button>'
            f'<button onclick="autoplanExport(\'{chart_id}\', \'svg\')">SVG</button></div></div>')


def _table(rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f'<td class="{"num" if _numeric(c) else ""}">{html.escape(str(c))}</td>'
                                    for c in row) + "</tr>" for row in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _numeric(text) -> bool:
    return str(text).replace(",", "").replace(".", "").replace("%", "").replace("-", "").replace("+", "").isdigit()


def render(page: Page) -> str:
    """The HTML text of `page`; pure."""
    figures = {}
    parts = [f"<h1>{html.escape(page.title)}</h1>", f'<div class="sub">{html.escape(page.subtitle)}</div>']
    for sec in page.sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.note:
            parts.append(f'<div class="note">{html.escape(sec.note)}</div>')
        if sec.charts:
            parts.append(f'<div class="grid" style="grid-template-columns: repeat({sec.columns}, minmax(0, 1fr))">')
            for chart_id, fig in sec.charts:
                figures[chart_id] = json.loads(fig.to_json()) if isinstance(fig, go.Figure) else fig
                parts.append(_chart(chart_id))
            parts.append("</div>")
        if sec.table:
            parts.append(_table(sec.table))
        if sec.items:
            parts.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in sec.items) + "</ul>")
    data = json.dumps(figures, separators=(",", ":")).replace("</", "<\\/")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(page.title)}</title><style>{CSS}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>{''.join(parts)}"
            f"<script>{SCRIPT % data}</script></body></html>\n")
