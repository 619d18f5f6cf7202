import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):  # the repo (arbench, sweeps) and tests/paths.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder (``runs/`` lands there); config paths stay absolute."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
