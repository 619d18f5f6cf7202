"""Command lines generated from config dataclasses (arbench.options)."""

import argparse
from dataclasses import dataclass, replace

import pytest

from arbench.bench.__main__ import parser as bench_parser
from arbench.bench.config import BenchConfig
from arbench.options import add_options, given, opt


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = opt((1, 2), help="sizes", at_least=1)
    rate: float = opt(0.5, help="rate", at_least=0)
    out_dir: str = opt("out", help="where", flag="--out")
    twins: tuple[str, ...] = opt((), help="twins", nargs="*", if_empty=("all",))
    memory: bool = opt(True, help="measure memory")
    files: tuple[str, ...] = opt((), help="files", repeat=True)
    hidden: int = 3


def parse(*argv: str) -> dict:
    ap = argparse.ArgumentParser()
    add_options(ap, Config)
    return given(ap.parse_args(list(argv)), Config)


def test_only_given_options_are_returned_typed_and_checked():
    assert parse() == {}
    assert parse("--sizes", "4", "8", "--rate", "2", "--out", "x") == {
        "sizes": (4, 8), "rate": 2.0, "out_dir": "x"}
    assert parse("--twins") == {"twins": ("all",)}
    assert parse("--twins", "a", "b") == {"twins": ("a", "b")}
    assert parse("--no-memory") == {"memory": False}
    assert parse("--files", "a.yaml", "--files", "b.yaml") == {"files": ("a.yaml", "b.yaml")}
    with pytest.raises(ValueError, match="--sizes must be >= 1, got 0"):
        parse("--sizes", "3", "0")
    with pytest.raises(SystemExit):
        parse("--hidden", "4")  # a field without opt() is not an option


def test_every_bench_option_reaches_its_field():
    """The bench's option names are its fields' (``--p`` and ``--out`` renamed), and applying
    them to the default profile gives the config the options describe."""
    args = bench_parser().parse_args(["--p", "2", "--out", "o", "--seq-lens", "64",
                                      "--no-train", "--compile"])
    cfg = replace(BenchConfig(), **given(args, BenchConfig))
    assert (cfg.ps, cfg.out_dir, cfg.seq_lens, cfg.train, cfg.compile) == (
        (2,), "o", (64,), False, ("all",))
    assert cfg.memory and cfg.methods == ()
