"""The building blocks of ``ds-bench report --html``'s page: one self-contained HTML file.

Everything is inline (styles, the table-sorting script, plots as SVG, downloads as ``data:`` URLs): the
page fetches nothing, so it opens from a file:// URL, offline, and survives being mailed or archived.
Tables sort by a click on a header (a dozen lines of script; numbers sort by their cell's ``data-value``)
and read as plain tables without it; a print style drops the colours. Every text from a record is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

from ds_bench.report.numbers import number

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 1.5em;color:#1b1b1b}
h1{font-size:1.5em;margin:.2em 0}h2{border-bottom:2px solid #345;padding-bottom:.15em;margin-top:1.6em}
h3{margin:1.1em 0 .3em}nav a{margin-right:.9em}.meta{color:#555}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:13px}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top;white-space:nowrap}
td.wrap{white-space:normal;min-width:16em}
th{background:#eef2f6;cursor:pointer;white-space:nowrap}th.sorted-asc::after{content:" \\25B2"}
th.sorted-desc::after{content:" \\25BC"}td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok,.pass,.same,.faster{color:#176317;font-weight:600}
.failed,.fail,.oom,.crashed,.timeout,.slow,.slower,.differs{color:#a4161a;font-weight:600}
.skipped,.not-measured,.bound{color:#7a5b00}.plot svg{max-width:100%;height:auto}.note{color:#444;margin:.3em 0}
.scroll{overflow-x:auto}
table.fit{font-size:12px}table.fit th,table.fit td{white-space:normal;overflow-wrap:anywhere}
table.fit td.num{white-space:nowrap;overflow-wrap:normal}code{background:#f4f4f4;padding:0 .2em}
@media print{nav,.download{display:none}th{background:none}h2{page-break-before:auto}
table,.plot{page-break-inside:avoid}}
"""

SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("sorted-asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(row) { var c = row.cells[col], v = c.getAttribute("data-value");
        return v !== null && v !== "" && !isNaN(v) ? [0, parseFloat(v)] : [1, c.textContent.trim()]; }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        var d = x[0] - y[0] || (x[0] === 0 ? x[1] - y[1] : x[1].localeCompare(y[1])); return asc ? d : -d; });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


WRAP_CHARS = 40


class Cell:
    """A table cell: its text, the raw number it shows (sorted by, and read back by tests) and a class."""

    def __init__(self, text, value: float | int | None = None, cls: str = "", key: str = ""):
        self.text, self.value, self.cls, self.key = text, value, cls, key

    def render(self) -> str:
        long_text = len(str(self.text)) > WRAP_CHARS  # a sentence wraps; keys and numbers stay on one line
        classes = " ".join(c for c in (self.cls, "num" if self.value is not None else "", "wrap" if long_text else "")
                           if c)
        attrs = f' class="{esc(classes)}"' if classes else ""
        attrs += f' data-value="{self.value!r}"' if self.value is not None else ""
        attrs += f' data-key="{esc(self.key)}"' if self.key else ""
        return f"<td{attrs}>{esc(self.text)}</td>"


def num(value: float | int | None, fmt: str | None = None, key: str = "", scale: float = 1.0, digits: int = 4) -> Cell:
    """A number cell (``-`` when unknown): ``fmt`` (``"{:d}"``, ``"{:.2f}"``), by default ``numbers.number`` to
    ``digits`` significant digits; ``scale`` divides what is shown, ``data-value`` keeps the record's."""
    if value is None:
        return Cell("-", key=key)
    shown = value if scale == 1.0 else value / scale
    return Cell(number(shown, digits) if fmt is None else fmt.format(shown), value, key=key)


def status(text: str | None) -> Cell:
    """A status cell, its class the status's own word (``ok``, ``oom``, ``not-measured``) and nothing else."""
    return Cell(text or "-", cls=re.sub(r"[^a-z0-9-]", "", (text or "").lower().replace(" ", "-"))[:32])


def table(headers: list[str], rows: list[list], table_id: str = "", sortable: bool = True, fit: bool = False) -> str:
    """Rows of ``Cell`` (or plain values, shown as text). ``fit``: a wide table fits the page rather than
    scrolling sideways (a smaller font; headers and text cells wrap, a header after each ``/`` too; numbers not)."""
    head = "".join(f"<th>{_header(h) if fit else esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join((c if isinstance(c, Cell) else Cell(c)).render() for c in row) + "</tr>"
                   for row in rows)
    classes = " ".join(c for c in ("sortable" if sortable else "", "fit" if fit else "") if c)
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (f' class="{classes}"' if classes else "")
    return f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _header(text: str) -> str:
    return esc(text).replace("/", "/<wbr>")


def section(section_id: str, title: str, parts: list[str]) -> str:
    return f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def heading(text: str) -> str:
    return f"<h3>{esc(text)}</h3>"


def download(filename: str, data: dict, label: str) -> str:
    """A link that saves ``data`` as a JSON file: the bytes are in the page (a ``data:`` URL)."""
    payload = base64.b64encode((json.dumps(data, indent=2, sort_keys=True) + "\n").encode()).decode()
    return (f'<p class="download"><a download="{esc(filename)}" href="data:application/json;base64,{payload}">'
            f"{esc(label)}</a></p>")


@contextmanager
def svg_plot(parts: list[str], nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float],
             title: str = "") -> Iterator[tuple]:
    """``with svg_plot(parts, figsize=(7, 4)) as (fig, ax):`` a matplotlib figure appended to ``parts`` as
    inline SVG (text kept as text, so the page stays searchable) when the block ends normally."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "ds_bench"}):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize)
        try:
            yield fig, axes
            fig.tight_layout()
            out = io.StringIO()
            fig.savefig(out, format="svg")
        finally:
            plt.close(fig)
    svg = out.getvalue()
    svg = svg[svg.index("<svg"):]  # the XML prolog and doctype are not HTML
    label = f' aria-label="{esc(title)}"' if title else ""
    parts.append(f'<div class="plot" role="img"{label}>{svg}</div>')


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """The whole document; ``sections``: (id, nav label, HTML)."""
    nav = " ".join(f'<a href="#{esc(sid)}">{esc(label)}</a>' for sid, label, _ in sections)
    body = "".join(content for _, _, content in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p class=\"meta\">{esc(subtitle)}</p><nav>{nav}</nav></header>"
            f"{body}<script>{SORT_SCRIPT}</script></body></html>\n")
