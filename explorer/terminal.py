"""Text from a file, made safe to print on a terminal: every control and bidi character shown as a visible escape.

A node name, a model name or a message quoting one may hold anything a file
can: a newline or a tab (which would forge a line or a column of the command
line's tables), an ANSI escape sequence (which would retitle or clear the
terminal), a C1 control, or a bidirectional override (U+202A-E, U+2066-9,
U+061C, U+200E/F) that reorders what follows it on screen. ``visible(text)``
replaces each such character with the escape a Python reader would write
(``\\n``, ``\\t``, ``\\x1b``, ``\\x85``, ``\\u202e``), so that the text keeps
its length on one line and shows what it holds. Printable text, non-ASCII
letters included, is left as it is.

Layer 0: no torch, no UI.
"""

from __future__ import annotations

import re

# C0 (tab and newline included), DEL, C1, the line and paragraph separators, and every character
# that changes the direction of the text after it.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    ch = match.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object) -> str:
    """``str(text)`` with every control and bidi character replaced by its visible escape (one line)."""
    return _INVISIBLE.sub(_escape, str(text))


def visible_lines(text: object) -> str:
    """A multi-line text of our own (a table) whose lines may quote file text: each line through
    ``visible``, the line breaks kept."""
    return "\n".join(visible(line) for line in str(text).split("\n"))
