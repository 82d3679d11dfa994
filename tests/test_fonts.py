"""The app's own CJK font (``explorer/ui/fonts.py``): it covers every Chinese character the app can write, and the
app declares it (a browser with no CJK font of its own drawing the 中文 pages with it: ``tests/test_browser.py``,
which shares that module's running app)."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorer.ui import fonts

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_subset_covers_every_chinese_character_of_the_sources():
    """A Chinese text added with a character the subset lacks fails here (run ``assets/make_cjk_font.py``)."""
    pytest.importorskip("brotli")
    from fontTools.ttLib import TTFont

    font = TTFont(str(fonts.FONT_PATH))
    covered = {chr(c) for c in font.getBestCmap()}
    needed = fonts.characters_needed()
    assert len(needed) > 500 and "融" in needed                       # the scan finds the catalogs' Chinese
    missing = sorted(needed - covered)
    assert not missing, f"run python3 assets/make_cjk_font.py: the font lacks {''.join(missing[:40])}"
    assert font["name"].getDebugName(1) == "Fusion Explorer CJK Subset"   # the license reserves "Source"
    assert fonts.FONT_PATH.stat().st_size < 400 * 1024
    assert (fonts.FONT_PATH.parent / "OFL-1.1.txt").is_file()
    # the scan sees a new character: a file with one the font lacks
    extra = Path(__file__).parent / "_fonts_probe"
    extra.mkdir(exist_ok=True)
    try:
        (extra / "probe.py").write_text('"""probe"""\nTEXT = "龘"\n', encoding="utf-8")
        assert "龘" in fonts.characters_needed(extra) and "龘" not in covered
    finally:
        (extra / "probe.py").unlink()
        extra.rmdir()


def test_the_face_extends_streamlits_own_family_for_cjk_only():
    css = fonts.font_face_css("")
    assert "font-family:'Source Sans'" in css and "url('/app/static/cjk-subset.woff2')" in css
    assert "unicode-range:U+3000-303F, U+3400-4DBF, U+4E00-9FFF, U+FF00-FFEF" in css
    assert "font-weight:100 900" in css                     # Streamlit's own descriptors: one composite family
    assert "font-style:normal" in css and "font-style:italic" in css
    assert "url('/base/app/static/" in fonts.font_face_css("/base/")
    html = fonts.with_font('<html><head></head><body>"face": "sans-serif"</body></html>')
    assert fonts.IFRAME_FAMILY in html.split("</head>")[0] and f"sans-serif, '{fonts.IFRAME_FAMILY}'" in html
    static = (ROOT / ".streamlit" / "config.toml").read_text()
    assert "enableStaticServing = true" in static
