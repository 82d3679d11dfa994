"""English and 中文: one catalog of the app's strings, ``t(key)``, and the sidebar's language switch.

Every string a user reads goes through this module:

- ``t("learn.title", model=...)``: the catalog entry ``key`` in the current
  language, formatted with ``str.format`` keywords. The catalog is merged from
  ``explorer/ui/locale/*.py``, one module per page or subject, each a dict
  ``STRINGS = {key: (english, chinese)}``: the two languages side by side, so
  a reviewer reads them together and a missing one is a test failure
  (``tests/test_i18n.py``), never a silent fallback.
- ``pattern_text(pattern, field)``, ``message(text)``, ``translate_phrases(label)``:
  what a fusion family says (a pattern's title and explanation, a near miss, a
  refusal, a kernel label) is a ``explorer.words.Message`` with an id and
  arguments, declared in both languages beside the family's patterns
  (``explorer/fusions/<family>.py``'s ``WORDS``; the registry collects them,
  ``explorer.fusions.WORDS``), and rendered here by its id. A label that came
  back as plain English (a JSON report, a child process) is read back against
  the same templates. No rule is written here for a family's sentence.
- ``message(text)`` renders every other engine message the same way: what the
  runtime, the loaders, the plans and the report write for a person is a
  ``Message`` of ``explorer.messages`` (progress, errors, refusals, a report's
  notes), rendered by its id, or read back from its English against those same
  templates when it crossed a process or a JSON file as text. A text no template
  makes is shown in English, marked as such in Chinese.
- ``translate_text(english)``: a family message, or a text of the translation
  memory (``TEXTS`` of the locale modules: the zoo's descriptions).
- ``language_switch()``: the sidebar's radio (widget key ``lang``); a link may
  say ``?lang=zh``, and the address bar follows the switch.

The language lives in ``st.session_state["lang"]`` ("en" or "zh"). ``t_in``
and friends take it explicitly, for tests and for code that has no session.
Streamlit is imported only by the functions that read the session, so that
renderer-neutral modules (``explorer.ui.graph``) can use ``t_in`` with a
language they are given, without importing Streamlit.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import string
from typing import Any

from explorer.words import Message, Reader, render

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


# ------------------------------------------------------------------ the families' words

@functools.lru_cache(maxsize=1)
def family_words() -> dict[str, tuple[str, str]]:
    """Every family's words and the shared ones, from the registry (``explorer.fusions.WORDS``):
    {message id: (english, chinese)}."""
    from explorer.fusions import WORDS

    return WORDS


@functools.lru_cache(maxsize=1)
def engine_words() -> dict[str, tuple[str, str]]:
    """Every message the engine can write: the families' (``family_words``) and the runtime's, the loaders', the
    plans' and the report's (``explorer.messages.WORDS``): {message id: (english, chinese)}."""
    from explorer import messages

    return merge_catalogs(family_words(), messages.WORDS)


def merge_catalogs(*catalogs: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """One catalog from several; an id in two of them is an error."""
    out: dict[str, tuple[str, str]] = {}
    for catalog in catalogs:
        for mid, pair in catalog.items():
            if mid in out:
                raise KeyError(f"message id {mid} is declared twice")
            out[mid] = pair
    return out


@functools.lru_cache(maxsize=1)
def _reader() -> Reader:
    return Reader(family_words())


@functools.lru_cache(maxsize=1)
def _engine_reader() -> Reader:
    return Reader(engine_words())


def family_message(text: Any) -> Message | None:
    """``text`` as a family ``Message``: itself, or read back from its English (a label or reason that came
    through a JSON report or a child process as plain text) against the families' templates; None when no
    template makes it."""
    if isinstance(text, Message):
        return text if text.id in family_words() else None
    return _reader().parse(text) if isinstance(text, str) and text else None


def engine_message(text: Any) -> Message | None:
    """``text`` as any engine ``Message`` (a family's or ``explorer.messages``'): itself, or read back from its
    English; None when no template makes it."""
    if isinstance(text, Message):
        return text if text.id in engine_words() else None
    return _engine_reader().parse(text.strip()) if isinstance(text, str) and text.strip() else None


def render_family(text: Any, lang: str | None = None) -> str | None:
    """A family's message in ``lang`` (None when ``text`` is not one)."""
    msg = family_message(text)
    if msg is None:
        return None
    lang = lang or current()
    return render(msg, lang, family_words(), translate=lambda free: message(free, lang))


@functools.lru_cache(maxsize=1)
def _memory() -> dict[str, str]:
    """Every ``TEXTS`` of ``explorer.ui.locale.*`` merged: {english: chinese} (the zoo's descriptions). An English
    text given two different translations is an error (two modules would disagree on it)."""
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


def translate_text(english: Any, lang: str | None = None) -> str:
    """A text in ``lang``: a family's message (a pattern's label, a kernel choice) by its id, a zoo description
    through the translation memory (``TEXTS`` of the locale modules), else the text as it is."""
    lang = lang or current()
    if lang == "en" or not english:
        return str(english)
    rendered = render_family(english, lang)
    if rendered is not None:
        return rendered
    return _memory().get(english, str(english))


def has_translation(english: Any) -> bool:
    """Whether a text has its Chinese: a family message, or an entry of the translation memory."""
    return not english or family_message(english) is not None or english in _memory()


def pattern_text(pattern: Any, field: str, lang: str | None = None) -> Any:
    """A pattern's ``label``, ``explanation``, ``implementation``, ``formula`` (str) or ``caveats`` (tuple),
    in ``lang`` (the session's by default)."""
    value = getattr(pattern, field)
    if isinstance(value, tuple):
        return tuple(translate_text(v, lang) for v in value)
    return translate_text(value, lang)


def family_title(family: str, lang: str | None = None) -> str:
    """A family's title ("Convolution (Conv+BN, epilogues)") in ``lang``: its ``WORDS`` entry ``<family>.title``."""
    pair = family_words().get(f"{family}.title")
    if pair is None:
        return family
    return pair[0] if (lang or current()) == "en" else pair[1]


# ------------------------------------------------------------------ other engine messages

UNTRANSLATED = "（英文原文）"


def message(text: Any, lang: str | None = None) -> str:
    """An engine message in ``lang``: English as written; in Chinese a ``Message`` (a family's or
    ``explorer.messages``') by its id, or read back from its English against the same templates (its arguments
    that are messages rendered too), else the English text marked "（英文原文）"."""
    lang = lang or current()
    if lang == "en" or not text:
        return str(text)
    msg = engine_message(text)
    if msg is None:
        return f"{text}{UNTRANSLATED}"
    return render(msg, lang, engine_words(), translate=lambda free: message(free, lang), read=engine_message)


def translate_phrases(text: Any, lang: str | None = None) -> str:
    """A kernel label (an implementation of the engine) in ``lang``: a family's message by its id, or read back
    from its English; a label no template makes stays as written."""
    lang = lang or current()
    if lang == "en" or not text:
        return str(text)
    rendered = render_family(text, lang)
    return str(text) if rendered is None else rendered


# ------------------------------------------------------------------ Streamlit's own widget text

def uploader_css(lang: str) -> str:
    """A ``<style>`` that puts the catalog's words (``app.upload.*``) in place of the English Streamlit writes
    into every file uploader (its button's "Upload", and "200MB per file", Streamlit's limit rather than the
    app's): both hidden, ours shown in their place. The app's size limit is in each uploader's own label
    (``app.limit``), so it is said once, in the chosen language."""
    def css_text(key: str) -> str:
        return t_in(lang, key).replace("\\", "\\\\").replace('"', '\\"')

    zone = '[data-testid="stFileUploaderDropzone"]'
    hint = f'{zone} [data-testid="stFileUploaderDropzoneInstructions"] > div'
    label = f'{zone} button [data-testid="stMarkdownContainer"]'
    return ("<style>"
            f"{hint} > span,{hint} > small,{label} > p{{display:none}}"
            f'{hint}::after{{content:"{css_text("app.upload.drop")}"}}'
            f'{label}::after{{content:"{css_text("app.upload.button")}"}}'
            "</style>")


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
