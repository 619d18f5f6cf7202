"""Hostile files for the tests: a checkpoint whose unpickling would write a marker file."""

from pathlib import Path
from typing import Any

import torch


class WritesMarker:
    """Unpickled, this calls ``open(path, "w")``: the marker file appears if code ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def hostile_checkpoint(path: Path, marker: Path, base: Path | None = None) -> Path:
    """Write to ``path`` the checkpoint at ``base`` (a real one, read tensors only), or a bare
    ``{"state_dict": {}}``, with a payload that creates ``marker`` when unpickled."""
    state = torch.load(base, map_location="cpu", weights_only=True) if base else \
        {"state_dict": {}}
    torch.save({**state, "payload": WritesMarker(marker)}, path)
    return path
