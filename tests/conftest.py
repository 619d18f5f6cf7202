import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYTHONWARNINGS", "ignore")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder (``runs/`` lands there); config paths stay absolute."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(name: str) -> str:
    return str(ROOT / "configs" / name)
