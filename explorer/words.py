"""Words with an identity: a ``Message`` is English text that also carries its id and its arguments.

The engine speaks no language but English, and renders nothing for a UI. What a
fusion family says to a person (a pattern's title and explanation, a near miss,
a refusal, a kernel label, its teaching text) is declared once, beside the
family's patterns, in both languages, as templates with named fields::

    WORDS = Words("conv", {
        "bn_training": ("BatchNorm in training mode: {why}", "BN 处于训练模式：{why}"),
    })
    reason = WORDS("bn_training", why=...)      # a Message: str(reason) is the English

A ``Message`` *is* a ``str`` (its English rendering), so the command line, the
JSON reports and every comparison read it as before; the UI renders it in the
chosen language by its id (``render``), arguments that are messages themselves
rendered in turn. A text that crossed a process or a JSON file as plain English
is read back against the same templates (``parse``): the templates are the only
source, no rule is written by hand for a sentence.
"""

from __future__ import annotations

import re
import string
from typing import Any, Callable, Iterable, Mapping

#: {message id: (english template, chinese template)}
Catalog = Mapping[str, tuple[str, str]]

LANGS = ("en", "zh")


class Message(str):
    """English text (the ``str`` value) that knows its ``id`` and its ``args`` (names to values; a value may be a
    ``Message`` itself)."""

    id: str
    args: dict[str, Any]

    def __new__(cls, id: str, english: str, args: Mapping[str, Any] | None = None) -> "Message":
        obj = super().__new__(cls, english)
        obj.id = id
        obj.args = dict(args or {})
        return obj

    def __reduce__(self):
        return (Message, (self.id, str(self), self.args))

    def __repr__(self) -> str:
        return f"Message({self.id!r}, {str(self)!r})"


def fields(template: str) -> list[str]:
    """The named fields of a template, in order (``{n:.1f}`` counts as ``n``)."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f]
    except ValueError:        # a lone brace: a text with no fields
        return []


class _Lenient(string.Formatter):
    """``str.format``, except that a value read back as text keeps its text under a numeric format spec."""

    def format_field(self, value: Any, format_spec: str) -> str:
        try:
            return super().format_field(value, format_spec)
        except (ValueError, TypeError):
            return str(value)


_FORMATTER = _Lenient()


def _fill(template: str, args: Mapping[str, Any]) -> str:
    return _FORMATTER.format(template, **args) if fields(template) else template


class Words:
    """A family's texts under its prefix: ``{key: (english, chinese)}``. Calling it makes a ``Message``."""

    def __init__(self, prefix: str, texts: Mapping[str, tuple[str, str]]) -> None:
        self.prefix = prefix
        self.texts: dict[str, tuple[str, str]] = {f"{prefix}.{k}": v for k, v in texts.items()}

    def __call__(self, key: str, **args: Any) -> Message:
        mid = f"{self.prefix}.{key}"
        english = self.texts[mid][0]
        missing = set(fields(english)) - set(args)
        if missing:
            raise KeyError(f"message {mid} needs {sorted(missing)}")
        return Message(mid, _fill(english, args), args)

    def __contains__(self, key: str) -> bool:
        return f"{self.prefix}.{key}" in self.texts


def merge(words: Iterable[Words]) -> dict[str, tuple[str, str]]:
    """One catalog from many ``Words``; an id declared twice is an error."""
    out: dict[str, tuple[str, str]] = {}
    for w in words:
        for mid, pair in w.texts.items():
            if mid in out:
                raise KeyError(f"message id {mid} is declared twice")
            out[mid] = pair
    return out


#: Arguments that hold free text (an exception's message) rather than a name: ``render`` hands a plain one to its
#: ``translate`` callback.
FREE_TEXT = ("reason",)


def render(text: Any, lang: str, catalog: Catalog, translate: Callable[[str], str] | None = None,
           read: Callable[[str], "Message | None"] | None = None) -> str:
    """``text`` in ``lang``: a ``Message`` by its id's template (its message arguments rendered too, a plain free-text
    argument through ``translate``, any other plain argument read back by ``read`` when it is a message's English,
    as a ``Reader`` reads the arguments of a text: a status that crossed a process inside a message made here);
    any other text as it is. A message whose id the catalog lacks stays in English."""
    if not isinstance(text, Message) or lang == "en":
        return str(text)
    pair = catalog.get(text.id)
    if pair is None:
        return str(text)
    template = pair[LANGS.index(lang)] if lang in LANGS else pair[0]
    args = {}
    for k, v in text.args.items():
        if not isinstance(v, Message) and read is not None and isinstance(v, str) and k not in FREE_TEXT:
            v = read(v) or v
        if isinstance(v, Message):
            v = render(v, lang, catalog, translate, read)
        elif translate is not None and k in FREE_TEXT and isinstance(v, str):
            v = translate(v)
        args[k] = v
    return _fill(template, args)


# ------------------------------------------------------------------ reading English back

#: A template needs this many letters outside its fields to be read back (``"{what} ({why})"`` would match anything).
_MIN_LITERAL = 4


#: What a field with a numeric format spec (``{n:d}``, ``{ms:.1f}``) reads back: a number, never words.
_NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?"


def _numeric(spec: str | None) -> bool:
    return bool(spec) and spec[-1] in "dfFgGeE%n"


def _compile(template: str, greedy: bool) -> re.Pattern | None:
    parts, seen, literal, numeric_only = [], set(), 0, True
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:        # a lone brace: a text with no fields, never formatted
        parsed = [(template, None, None, None)]
    for text, field, spec, _ in parsed:
        parts.append(re.escape(text))
        literal += sum(c.isalpha() for c in text)
        if field:
            if field in seen:
                parts.append(f"(?P={field})")
            elif _numeric(spec):
                parts.append(f"(?P<{field}>{_NUMBER})")
            else:
                numeric_only = False
                parts.append(f"(?P<{field}>.+{'' if greedy else '?'})")
            seen.add(field)
    # a template reads back only with enough text of its own ("{what} ({why})" would match anything); one whose
    # fields are all numbers ("{n:d} s") needs a letter only
    if literal < (1 if numeric_only and seen else _MIN_LITERAL):
        return None
    return re.compile("".join(parts), re.DOTALL)


class Reader:
    """Reads plain English back into a ``Message`` against a catalog's English templates.

    Every template that makes the text is tried, its fields split both ways (shortest and longest first); the
    reading kept is the one whose arguments are best explained: fewest arguments with spaces that are no message
    themselves, then the template with the most literal text."""

    def __init__(self, catalog: Catalog) -> None:
        self._rules = []
        for mid, (en, _) in catalog.items():
            letters = sum(c.isalpha() for c in re.sub(r"\{[^}]*\}", "", en))
            for greedy in (False, True):
                rx = _compile(en, greedy)
                if rx is not None and (greedy is False or rx.groups):
                    self._rules.append((mid, rx, letters))
        self._cache: dict[str, Message | None] = {}

    def parse(self, text: str) -> Message | None:
        """The message whose English is ``text`` (its arguments read back where they are messages), or None."""
        if isinstance(text, Message):
            return text
        if text in self._cache:
            return self._cache[text]
        self._cache[text] = None           # a text is never its own argument
        best, best_score = None, None
        for mid, rx, letters in self._rules:
            hit = rx.fullmatch(text)
            if not hit:
                continue
            args = {k: (self.parse(v) or v) for k, v in hit.groupdict().items()}
            unexplained = sum(1 for v in args.values() if not isinstance(v, Message) and " " in v)
            score = (unexplained, -letters)
            if best_score is None or score < best_score:
                best, best_score = Message(mid, text, args), score
        self._cache[text] = best
        return best
