"""The frame of ``posenc report``'s page: its style, the sections in order under a summary and a
table of contents, and images embedded as base64 so the page opens from disk.

A small inline script marks ``<body data-images-ok="true">`` once every image has decoded
(``naturalWidth > 0``), so a headless browser can verify the page.
"""

from __future__ import annotations

import base64
import datetime
import html
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Section", "img", "render_html"]

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.agrees { background: #e3f6e3; } td.differs { background: #fbe3e3; }
td.untrained, td.noclaim, td.na { background: #f4f4f4; color: #555; } td.error { background: #ffd27f; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 13px; color: #444; } dt { font-weight: bold; margin-top: .6em; }
dd { margin-left: 1.5em; font-size: 14px; } .note { color: #777; font-size: 13px; }
td.ok { background: #e3f6e3; } td.bad { background: #fbe3e3; } pre { font-size: 13px; background: #f7f7f7; padding: .6em; }
ul.summary li { margin: .3em 0; } nav ol { columns: 2; font-size: 14px; }
"""

# Sets data-images-ok on <body> when every <img> has decoded: tests read it from the DOM.
SCRIPT = """
(function () {
  function check() {
    var imgs = Array.prototype.slice.call(document.images);
    var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
    document.body.setAttribute("data-images-loaded", ok + "/" + imgs.length);
    document.body.setAttribute("data-images-ok", String(ok === imgs.length));
    if (ok === imgs.length) { document.title = "[images ok] " + document.title.replace(/^\\[images ok\\] /, ""); }
  }
  check();
  window.addEventListener("load", check);
})();
"""


def img(path: Path, alt: str) -> str:
    """The PNG at ``path`` as an ``<img>`` carrying its bytes."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


@dataclass
class Section:
    """A part of the page: its anchor, its title in the contents, its HTML (headed by itself)."""

    anchor: str
    title: str
    body: str


def render_html(summary: list[str], sections: list[Section]) -> str:
    """The page: title, summary, contents, then each section in order."""
    from .. import __version__

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    items = "".join(f"<li>{html.escape(x)}</li>" for x in summary)
    toc = "".join(f'<li><a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a></li>' for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posenc report</title><style>{CSS}</style></head>
<body>
<h1>posenc report</h1>
<p class="note">posenc {__version__}, {when}.</p>
<h2 id="summary">Summary</h2>
<ul class="summary">{items}</ul>
<nav id="contents"><h2>Contents</h2><ol>{toc}</ol></nav>
{"".join(s.body for s in sections)}
<script>{SCRIPT}</script>
</body></html>
"""
