"""Text from a file or an upload, made safe for the elements that render markdown or HTML.

A node name, an origin, a module path, an uploaded file's name, a report's
field or a message quoting one of them is data: a reader must see it as
written, and it must draw nothing (no link, no image fetched from a remote
host, no HTML, no LaTeX, no icon, no code span it can end early). Streamlit
renders markdown with CommonMark and remark-gfm, whose autolink literals are
found in the text *after* backslash escapes are resolved (``http\\://x`` is a
link there), so escaping alone does not stop a bare URL from becoming a link.

- ``markdown(text)``: one line (control and bidi characters as visible
  escapes, ``explorer.terminal.visible``, so no override reorders what a
  reader sees); every character that starts markdown syntax backslash-escaped, and every autolink literal (``http://``, ``https://``,
  ``www.``, ``mailto:``, ``xmpp:``, ``name@host.tld``) broken by an invisible
  U+2060 WORD JOINER after its scheme or before its ``@``, so it reads the same
  and links nowhere.
- ``code(text)``: one line as a complete inline code span, fenced by more
  backticks than the longest run inside it (a backtick cannot end it), padded
  so that a leading or trailing backtick stays content. Inside a code span
  nothing is markup, autolinks included.
- ``html(text)``: ``html.escape`` for HTML written by the app.

No Streamlit here; the pages call these (``explorer.ui.files.escape_markdown``
is ``markdown``).
"""

from __future__ import annotations

import html as html_lib
import re
from typing import Any

from explorer.terminal import visible

WORD_JOINER = "\u2060"

# What makes Streamlit's markdown fetch, link or interpret: images and links ([ ] ( ) !), autolinks and
# HTML (< >), character references (&), LaTeX ($, where KaTeX's \includegraphics fetches), code spans
# (`), icon and emoji shortcodes and colour directives (:), tables (|), headings (#), strikethrough (~),
# emphasis (*), and the backslash itself. The underscore is kept: GFM does not emphasise inside a word,
# and identifiers such as conv_bn_relu then read as written in the page's source too.
_MARKDOWN_SPECIAL = re.compile(r"([\\`\[\]()<>!$:|&#~*])")
# Autolink literals of remark-gfm: a scheme before its colon, "www" before its dot, the "@" of an address.
_SCHEME = re.compile(r"(?i)(https?|mailto|xmpp|ftp|www)(?=\\?[:.])")
_AT = re.compile(r"@")


def one_line(text: Any) -> str:
    """``str(text)`` with every run of white space (newlines, tabs, U+2028 included) as one space."""
    return " ".join(str(text).split())


def markdown(text: Any) -> str:
    """``text`` on one line, shown as written by a markdown element: nothing in it is markup or a link."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", visible(one_line(text)))
    escaped = _SCHEME.sub(lambda m: m.group(1) + WORD_JOINER, escaped)
    return _AT.sub(WORD_JOINER + "@", escaped)


def code(text: Any) -> str:
    """``text`` on one line as an inline code span whose content is exactly ``text``."""
    content = visible(one_line(text))
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {content} {fence}"


def html(text: Any) -> str:
    """``text`` escaped for HTML (``&``, ``<``, ``>`` and both quotes)."""
    return html_lib.escape(str(text), quote=True)
