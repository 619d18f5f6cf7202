"""Time the MQAR generator: ``python -m arbench.data.benchmark [--examples 100000] ...``.

Prints examples/s of ``generate_mqar`` (median of repeats, with min-max) and, for contrast, of a
per-example NumPy generator (one ``rng.choice`` call per row, the usual approach), timed on a
subset and reported per example.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from arbench.checks import OneLineParser, check_int
from arbench.data.mqar import generate_mqar


def per_example_numpy(num_examples: int, seq_len: int, n: int, vocab: int, seed: int = 0,
                      power_a: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Reference generator with a Python loop over examples (what the vectorised one replaces)."""
    rng = np.random.default_rng(seed)
    half = vocab // 2
    slots = (seq_len - 2 * n) // 2
    prob = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
    prob /= prob.sum()
    inputs = rng.integers(0, vocab, size=(num_examples, seq_len))
    labels = np.full((num_examples, seq_len), -100)
    for i in range(num_examples):
        keys = rng.choice(np.arange(1, half), size=n, replace=False)
        values = rng.choice(np.arange(half, vocab), size=n, replace=False)
        inputs[i, 0:2 * n:2], inputs[i, 1:2 * n:2] = keys, values
        pos = 2 * n + 2 * rng.choice(slots, size=n, replace=False, p=prob)
        inputs[i, pos], labels[i, pos] = keys, values
    return inputs, labels


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv``, time the generator and the baseline, print both; bad input: one
    ``error:`` line and exit status 2."""
    ap = OneLineParser(prog="python -m arbench.data.benchmark",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100_000)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-examples", type=int, default=5_000,
                    help="examples timed for the per-example baseline (0 to skip)")
    args = ap.parse_args(argv)
    try:
        for flag, minimum in (("--examples", 1), ("--seq-len", 1), ("--pairs", 1),
                              ("--vocab", 1), ("--repeats", 1), ("--baseline-examples", 0)):
            check_int(flag, getattr(args, flag[2:].replace("-", "_")), minimum)
        generate_mqar(1, args.seq_len, args.pairs, vocab_size=args.vocab, seed=0)  # sizes
    except ValueError as err:
        ap.error(str(err).splitlines()[0])
    times = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        generate_mqar(args.examples, args.seq_len, args.pairs, vocab_size=args.vocab, seed=r)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"generate_mqar: {args.examples} examples, seq_len {args.seq_len}, {args.pairs} pairs, "
          f"vocab {args.vocab}: median {med:.3f} s (min {min(times):.3f}, max {max(times):.3f}) "
          f"= {args.examples / med:,.0f} examples/s over {args.repeats} repeats")
    if args.baseline_examples > 0:
        t0 = time.perf_counter()
        per_example_numpy(args.baseline_examples, args.seq_len, args.pairs, args.vocab)
        base = (time.perf_counter() - t0) / args.baseline_examples
        print(f"per-example numpy baseline: {1 / base:,.0f} examples/s "
              f"(projected {base * args.examples:.1f} s for {args.examples}); "
              f"vectorised speed-up {base * args.examples / med:.0f}x")


if __name__ == "__main__":
    main()
