"""English and 中文: one catalog of the app's strings, ``t(key)``, and the sidebar's language switch.

Every string a user reads goes through this module:

- ``t("learn.title", model=...)``: the catalog entry ``key`` in the current
  language, formatted with ``str.format`` keywords. The catalog is merged from
  ``explorer/ui/locale/*.py``, one module per page or subject, each a dict
  ``STRINGS = {key: (english, chinese)}``: the two languages side by side, so
  a reviewer reads them together and a missing one is a test failure
  (``tests/test_i18n.py``), never a silent fallback.
- ``pattern_text(pattern, field)``: the teaching text of a pattern (label,
  explanation, implementation, formula, caveats), written in English beside the
  pattern in ``explorer/fusions/<family>.py``. Its Chinese is looked up by the
  English text itself (``locale/patterns.py``), so that a changed English text
  has no stale translation: the test names it until it is translated again.
- ``message(text)``: a message the engine wrote in English (a near-miss reason,
  an error line), translated by pattern (``locale/messages.py``: a regular
  expression and its Chinese template); a message no pattern knows is shown in
  English, marked as such in Chinese. A group named ``msg...`` is itself a
  message (translated by the rules again), a group named ``text...`` a text of
  the translation memory (a pattern's label).
- ``translate_text(english)``: the translation memory, merged from the
  ``TEXTS = {english: chinese}`` of every locale module: the patterns' teaching
  texts (``locale/patterns.py``), the zoo's descriptions (``locale/zoo.py``),
  the kernel choices (``locale/fusions.py``).
- ``language_switch()``: the sidebar's radio (widget key ``lang``); a link may
  say ``?lang=zh``, and the address bar follows the switch.

The language lives in ``st.session_state["lang"]`` ("en" or "zh"). ``t_in``
and friends take it explicitly, for tests and for code that has no session.
Streamlit is imported only by the functions that read the session, so that
renderer-neutral modules (``explorer.graph_view``) can use ``t_in`` with a
language they are given, without importing Streamlit.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import string
from typing import Any

LANGUAGES: dict[str, str] = {"en": "English", "zh": "中文"}
DEFAULT = "en"
_INDEX = {"en": 0, "zh": 1}


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, tuple[str, str]]:
    """Every ``STRINGS`` entry of ``explorer.ui.locale.*`` merged: {key: (english, chinese)}.

    A key defined twice is an error (two modules would disagree on it)."""
    from explorer.ui import locale

    merged: dict[str, tuple[str, str]] = {}
    for info in sorted(pkgutil.iter_modules(locale.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{locale.__name__}.{info.name}")
        for key, pair in getattr(module, "STRINGS", {}).items():
            if key in merged:
                raise KeyError(f"catalog key '{key}' is defined twice (second time in locale/{info.name}.py)")
            merged[key] = pair
    return merged


def current() -> str:
    """The session's language ("en" or "zh"); English outside a Streamlit session."""
    import streamlit as st

    try:
        value = st.session_state.get("lang", DEFAULT)
    except Exception:  # no session (a script, a test): the default
        return DEFAULT
    return value if value in LANGUAGES else DEFAULT


def t_in(lang: str, key: str, **kwargs: Any) -> str:
    """The catalog text of ``key`` in ``lang``, formatted with ``kwargs``.

    An unknown key returns the key itself in brackets (``tests/test_i18n.py`` fails on any)."""
    pair = catalog().get(key)
    if pair is None:
        return f"[{key}]"
    text = pair[_INDEX.get(lang, 0)] or pair[0]
    return text.format(**kwargs) if kwargs else text


def t(key: str, **kwargs: Any) -> str:
    """``t_in`` in the session's language."""
    return t_in(current(), key, **kwargs)


def placeholders(text: str) -> set[str]:
    """The ``{name}`` fields of a format string (``{n:.1f}`` counts as ``n``)."""
    return {field for _, field, _, _ in string.Formatter().parse(text) if field}


# ------------------------------------------------------------------ pattern texts

@functools.lru_cache(maxsize=1)
def _pattern_memory() -> dict[str, str]:
    """Every ``TEXTS`` of ``explorer.ui.locale.*`` merged: {english: chinese}. An English text given two
    different translations is an error (two modules would disagree on it)."""
    from explorer.ui import locale

    merged: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(locale.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{locale.__name__}.{info.name}")
        for english, chinese in getattr(module, "TEXTS", {}).items():
            if merged.get(english, chinese) != chinese:
                raise KeyError(f"'{english[:60]}' is translated twice, differently (second time in "
                               f"locale/{info.name}.py)")
            merged[english] = chinese
    return merged


def translate_text(english: str, lang: str | None = None) -> str:
    """The Chinese of an English text of the translation memory (a pattern's teaching text, a zoo
    description, a kernel choice), or the English when ``lang`` is "en" or the text has no translation
    (the tests report those)."""
    lang = lang or current()
    if lang == "en" or not english:
        return english
    return _pattern_memory().get(english, english)


def has_translation(english: str) -> bool:
    """Whether an English text has its Chinese in the translation memory (``TEXTS`` of the locale modules)."""
    return not english or english in _pattern_memory()


def pattern_text(pattern: Any, field: str, lang: str | None = None) -> Any:
    """A pattern's ``label``, ``explanation``, ``implementation``, ``formula`` (str) or ``caveats`` (tuple),
    in ``lang`` (the session's by default)."""
    value = getattr(pattern, field)
    if isinstance(value, tuple):
        return tuple(translate_text(v, lang) for v in value)
    return translate_text(value, lang)


# ------------------------------------------------------------------ engine messages

@functools.lru_cache(maxsize=1)
def _message_rules() -> list[tuple[re.Pattern, str]]:
    """The ``RULES`` of ``locale/messages.py`` (the engine's messages) first, then those of every other
    locale module in name order (``locale/runtime.py``: the runner's progress, run and report errors, the
    notes a run report carries)."""
    from explorer.ui import locale
    from explorer.ui.locale import messages

    rules = list(messages.RULES)
    for info in sorted(pkgutil.iter_modules(locale.__path__), key=lambda i: i.name):
        if info.name != "messages":
            rules += getattr(importlib.import_module(f"{locale.__name__}.{info.name}"), "RULES", [])
    return [(re.compile(rx), zh) for rx, zh in rules]


UNTRANSLATED = "（英文原文）"


def message(text: str, lang: str | None = None) -> str:
    """An engine message in ``lang``: English as written; Chinese through the first rule of
    ``locale/messages.py`` that matches the whole text (its groups fill the template; a group named
    ``msg...`` is translated as a message again, one named ``text...`` through ``translate_text``), else
    the English text marked "（英文原文）"."""
    lang = lang or current()
    if lang == "en" or not text:
        return text
    for rx, template in _message_rules():
        hit = rx.fullmatch(text.strip())
        if hit:
            names = {index: name for name, index in rx.groupindex.items()}
            values = []
            for index, value in enumerate(hit.groups(), start=1):
                value, name = value or "", names.get(index, "")
                if name.startswith("msg"):
                    value = message(value, lang)
                elif name.startswith("text"):
                    value = translate_text(value, lang)
                values.append(value)
            return template.format(*values)
    return f"{text}{UNTRANSLATED}"


@functools.lru_cache(maxsize=1)
def _phrases() -> list[tuple[re.Pattern, str]]:
    from explorer.ui.locale import messages

    return [(re.compile(rx), zh) for rx, zh in messages.PHRASES]


def translate_phrases(text: str, lang: str | None = None) -> str:
    """A label that mixes op and kernel names with prose (an implementation label of the engine) in
    ``lang``: in Chinese every ``PHRASES`` rule of ``locale/messages.py`` replaced wherever it occurs, in
    order; the names stay as written."""
    lang = lang or current()
    if lang == "en" or not text:
        return text
    for rx, replacement in _phrases():
        text = rx.sub(replacement, text)
    return text


# ------------------------------------------------------------------ the switch

def language_switch() -> str:
    """The sidebar's language radio (key ``lang``); ``?lang=zh`` in a link sets it once per session, and
    the address bar follows it. Returns the language."""
    import streamlit as st

    ss = st.session_state
    if not ss.get("lang_link_read"):
        ss.lang_link_read = True
        wanted = st.query_params.get("lang")
        if wanted in LANGUAGES:
            ss.lang = wanted
    if ss.get("lang") not in LANGUAGES:
        ss.lang = DEFAULT
    st.sidebar.radio(t("app.language"), list(LANGUAGES), key="lang", horizontal=True,
                     format_func=LANGUAGES.__getitem__)
    if st.query_params.get("lang") != ss.lang:
        st.query_params["lang"] = ss.lang
    return ss.lang
