"""A CJK font the app serves itself, so that its 中文 never depends on the fonts of the machine that shows it.

Streamlit renders in the user's browser: the Chinese text is drawn with the
browser's fonts, and a machine without a CJK font (Debian's chromium as the
Makefile installs it, a fresh class machine) draws every Chinese character as
an empty box. The app therefore ships a subset of Noto Sans CJK SC (SIL Open
Font License 1.1, ``explorer/static/cjk-subset.LICENSE.txt``) holding every
CJK character its own sources contain, and serves it through Streamlit's
static file serving (``explorer/static/``, ``server.enableStaticServing``):

- ``font_face_css(base)``: an ``@font-face`` that adds the subset to the
  family Streamlit already draws with ("Source Sans", its theme's font; also
  to plotly's, which the Streamlit theme sets to the same) for the CJK ranges
  only (``unicode-range``), so that the browser fetches it only for a page
  that shows Chinese, and every Latin letter keeps Streamlit's own face;
- ``IFRAME_FAMILY`` and ``iframe_css(base)``: the same face under a name of its
  own for the drawn graph, which runs in an iframe of its own;
- ``characters_needed()``: every CJK character of the ``explorer`` package's
  sources (the catalogs of both languages and every family's words), which
  ``assets/make_cjk_font.py`` subsets the font to and ``tests/test_fonts.py``
  checks the committed font covers.

Text that comes from a user's file (a model's own names, in Chinese) may hold
characters outside the subset; the browser then uses the machine's fonts, as
any page would.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The committed subset (WOFF2) and where Streamlit serves it (``<base>/app/static/<name>``).
FONT_NAME = "cjk-subset.woff2"
FONT_PATH = Path(__file__).resolve().parents[1] / "static" / FONT_NAME

#: The family name of the face inside the graph's iframe (it has no Streamlit theme).
IFRAME_FAMILY = "Fusion Explorer CJK"

#: What the subset covers, and the ``unicode-range`` of its face: CJK punctuation, the unified ideographs
#: (and extension A), full-width forms; the sources' characters in these ranges are what it holds.
RANGES = ((0x3000, 0x303F), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xFF00, 0xFFEF))
_CJK = re.compile("[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in RANGES) + "]")


def unicode_range() -> str:
    """The CSS ``unicode-range`` of ``RANGES``."""
    return ", ".join(f"U+{lo:04X}-{hi:04X}" for lo, hi in RANGES)


def characters_needed(root: Path | None = None) -> set[str]:
    """Every character in ``RANGES`` that a ``.py`` file of the ``explorer`` package holds (the catalogs, the
    families' words, the engine's messages): what the app can show in 中文."""
    root = root or Path(__file__).resolve().parents[1]
    chars: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        chars.update(_CJK.findall(path.read_text(encoding="utf-8")))
    return chars


def font_url(base: str = "") -> str:
    """The subset's address under Streamlit's ``server.baseUrlPath`` (``base``, "" by default)."""
    base = base.strip("/")
    return f"/{base + '/' if base else ''}app/static/{FONT_NAME}"


#: The descriptors of Streamlit's own Source Sans face (its variable font: weights 100 to 900, upright). The
#: subset declares the same ones, so that the browser takes the two as one family split by ``unicode-range``;
#: with other descriptors it picks one face of the two per weight, and the Latin letters or the Chinese of a
#: weight lose their glyphs. (Headings' Chinese is therefore drawn at the regular weight.)
WEIGHTS = "100 900"


def _face(family: str, base: str) -> str:
    """The subset as ``family``'s CJK part, upright and italic (Streamlit has an italic Source Sans too: without an
    italic face of its own, an italic Chinese phrase would find no glyphs)."""
    return "".join(f"@font-face{{font-family:'{family}';src:url('{font_url(base)}') format('woff2');"
                   f"font-weight:{WEIGHTS};font-style:{style};font-display:swap;unicode-range:{unicode_range()};}}"
                   for style in ("normal", "italic"))


def font_face_css(base: str = "") -> str:
    """The ``<style>`` for the app's pages: the subset as the CJK part of Streamlit's own font family."""
    return f"<style>{_face('Source Sans', base)}</style>"


def iframe_css(base: str = "") -> str:
    """The ``<style>`` for the graph's iframe: the subset under ``IFRAME_FAMILY``, after the iframe's own
    faces (sans-serif for its notes, monospace for its tooltips)."""
    return (f"<style>{_face(IFRAME_FAMILY, base)}body{{font-family:sans-serif,'{IFRAME_FAMILY}';}}"
            f"div.vis-tooltip{{font-family:monospace,'{IFRAME_FAMILY}';}}</style>")


#: Loads the face for the canvas (a canvas draws with loaded fonts only, and does not redraw by itself).
_CANVAS_JS = ("<script>document.fonts && document.fonts.load(\"14px '" + IFRAME_FAMILY + "'\", \"中\")"
              ".then(function(){ if (window.network) { network.redraw(); } });</script>")


def with_font(html: str, base: str = "") -> str:
    """The drawn graph's HTML (``explorer.ui.graph.render_html``) with the subset: its face in the head, in
    the labels' font list (vis-network draws them on a canvas), and loaded before the labels are drawn again."""
    html = html.replace("<head>", "<head>" + iframe_css(base), 1)
    html = html.replace('"face": "sans-serif"', f'"face": "sans-serif, \'{IFRAME_FAMILY}\'"')
    return html.replace("</body>", _CANVAS_JS + "</body>", 1)
