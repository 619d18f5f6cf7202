"""Paths the tests share: the repo root and its config files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def config(name: str) -> str:
    return str(ROOT / "configs" / name)


SMOKE = ["--config", config("profiles/smoke.yaml"), "--config", config("sizes/tiny.yaml")]
"""main.py arguments for a seconds-long run: the smoke profile at the tiny size."""
