"""Shared fixtures: analyses of zoo models are cached for the whole session; the browser tests'
app (``app_url``) is started once per module that asks for it."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def analyzed(name: str, batch: int | None = None, seq_len: int | None = None):
    """(model, graph, detection) for a zoo model, computed once per test session."""
    from explorer.fusion_engine import analyze

    return analyze(name, batch=batch, seq_len=seq_len)


@pytest.fixture(scope="session")
def analyze_cached():
    return analyzed


@pytest.fixture(scope="module")
def app_url():
    """The URL of ``streamlit run explorer/app.py`` (``browser_harness.running_app``), started once for
    the module and stopped after it; skips when no chromium or no Playwright can be found."""
    from browser_harness import CHROMIUM, running_app

    if CHROMIUM is None:
        pytest.skip("no chromium found")
    pytest.importorskip("playwright.sync_api")
    with running_app() as url:
        yield url
