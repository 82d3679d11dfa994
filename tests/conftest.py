"""Shared fixtures: analyses of zoo models are cached for the whole session."""

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
