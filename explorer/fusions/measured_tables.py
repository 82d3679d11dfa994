"""A table of per-shape measurements that a family's selection reads: the attention family's
(``attention_measured.json``) and the grouped convolution's (``conv_grouped_measured.json``).

A table is JSON, ``{"schema": ..., "rows": [...]}``, written by a benchmark on the GPU and
committed as package data beside the family. ``MeasuredTable`` reads and checks one (a row that
is not what the family's ``row_ok`` accepts is a one-line ``TableError``), keeps the committed
one (read once), and swaps another in for a block (``swapped``: a benchmark's fresh table, or a
test's rows), which is what ``rows()`` then answers. Each family keeps its own key, its row
check and what it does with a row.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.resources
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path


class TableError(ValueError):
    """A measured table that is not one (one line)."""


class MeasuredTable:
    """One family's table: ``file`` (package data of ``package``), its ``schema`` string, ``row_ok(row)`` (whether a
    row is well formed), ``row_key(row)`` (the key its selection looks up) and ``row_words`` (what a row must be,
    for the error)."""

    def __init__(self, package: str, file: str, schema: str, row_ok: Callable[[object], bool],
                 row_key: Callable[[dict], tuple], row_words: str) -> None:
        self.package, self.file, self.schema = package, file, schema
        self._row_ok, self._row_key, self._row_words = row_ok, row_key, row_words
        self._swapped: contextvars.ContextVar[dict | None] = contextvars.ContextVar(f"table:{file}", default=None)
        self._committed: dict[tuple, dict] | None = None

    def read(self, text: str, where: str | None = None) -> dict[tuple, dict]:
        """The rows of ``text`` by key; ``TableError`` (one line, naming ``where``) for anything else."""
        where = where or self.file
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise TableError(f"{where}: not JSON ({exc.args[0][:80]})") from None
        if not isinstance(doc, dict) or doc.get("schema") != self.schema or not isinstance(doc.get("rows"), list):
            raise TableError(f"{where}: not a {self.schema} table")
        rows = {}
        for i, row in enumerate(doc["rows"]):
            if not self._row_ok(row):
                raise TableError(f"{where}: row {i} is not {self._row_words}")
            rows[self._row_key(row)] = row
        return rows

    def committed(self) -> dict[tuple, dict]:
        """The committed table (read once); empty where the file is absent."""
        if self._committed is None:
            path = importlib.resources.files(self.package).joinpath(self.file)
            self._committed = self.read(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return self._committed

    def is_swapped(self) -> bool:
        """Whether a table is swapped in (``swapped``) for the block running now."""
        return self._swapped.get() is not None

    def rows(self) -> dict[tuple, dict]:
        """The table in force: the one swapped in, else the committed one."""
        table = self._swapped.get()
        return self.committed() if table is None else table

    @contextlib.contextmanager
    def swapped(self, table: "str | os.PathLike | dict[tuple, dict]") -> Iterator[dict[tuple, dict]]:
        """``with table.swapped(path_or_rows):`` ``rows()`` answers this table (a file, read and checked, or rows
        ``read`` made) instead of the committed one."""
        rows = table if isinstance(table, dict) else self.read(Path(table).read_text(encoding="utf-8"), str(table))
        token = self._swapped.set(rows)
        try:
            yield rows
        finally:
            self._swapped.reset(token)
