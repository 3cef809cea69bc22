"""The report's page frame: the summary, then contents linking every section, the sections in
order, images carried as base64, and the script that marks the body once images decode."""

from __future__ import annotations

import base64
import re

from posenc.analysis.report_page import Section, img, render_html


def test_sections_in_order_under_summary_and_contents():
    sections = [Section("a", "First <one>", '<h2 id="a">A</h2>'), Section("b", "Second", '<h2 id="b">B</h2>')]
    page = render_html(["one line", "x < y"], sections)
    assert page.index('<h2 id="summary">') < page.index('<nav id="contents">') < page.index('id="a"') < page.index('id="b"')
    assert "<li>x &lt; y</li>" in page and "First &lt;one&gt;" in page  # text is escaped, bodies are not
    assert re.findall(r'<a href="#([^"]+)">', page) == ["a", "b"]
    assert "data-images-ok" in page and not re.search(r'(src|href)="(https?:|file:)', page)


def test_img_carries_the_bytes(tmp_path):
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nabc")
    tag = img(png, 'a "quote"')
    src = re.search(r'src="data:image/png;base64,([^"]+)"', tag).group(1)
    assert base64.b64decode(src) == png.read_bytes() and 'alt="a &quot;quote&quot;"' in tag
