"""Tables as the reports write them: Markdown lines and CSV files (sweeps, bench, approx)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def markdown_row(cells: Iterable[Any]) -> str:
    """``| a | b |``, each cell as ``str``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(header: Sequence[Any], rows: Iterable[Iterable[Any]] = ()) -> list[str]:
    """A Markdown table's lines: the header, its ``|---|`` rule, one line per row."""
    return [markdown_row(header), "|" + "---|" * len(header), *map(markdown_row, rows)]


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]],
              fields: Sequence[str] | None = None) -> Path:
    """``rows`` as CSV at ``path`` (UTF-8) under the header ``fields``, by default the first
    row's keys; with neither rows nor fields, an empty file."""
    path = Path(path)
    names = list(fields) if fields is not None else list(rows[0]) if rows else None
    with path.open("w", newline="", encoding="utf-8") as fh:
        if names is not None:
            writer = csv.DictWriter(fh, fieldnames=names)
            writer.writeheader()
            writer.writerows(rows)
    return path
