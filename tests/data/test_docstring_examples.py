"""Each task generator's worked example in its module docstring is what the generator gives."""

import pytest

import arbench.data.copying as copying
import arbench.data.incontext as incontext
import arbench.data.mqar as mqar
import arbench.data.overwrite as overwrite
from arbench.data.mqar import IGNORE_INDEX


def examples(doc: str) -> list[tuple[list[int], list[int]]]:
    """Every ``inputs`` line of ``doc`` with the ``labels`` line after it, as token lists
    (``.`` = ``IGNORE_INDEX``; ``|`` separators dropped)."""
    def tokens(line: str) -> list[int]:
        return [IGNORE_INDEX if t == "." else int(t) for t in line.split()[1:] if t != "|"]
    lines = [line.strip() for line in doc.splitlines()]
    return [(tokens(a), tokens(b)) for a, b in zip(lines, lines[1:])
            if a.startswith("inputs ") and b.startswith("labels ")]


CASES = [
    (mqar, lambda: mqar.generate_mqar(1, 16, 3, 16, seed=1)),
    (copying, lambda: copying.generate_selective_copying(1, 12, 3, 8, seed=0)),
    (overwrite, lambda: overwrite.generate_overwrite(1, 16, 3, 1, 16, random_non_queries=False,
                                                     seed=1)),
    (incontext, lambda: incontext.generate_in_context_recall(
        1, 16, 12, noise_fraction=0.25, noise_vocab_size=4, seed=0)),
    (incontext, lambda: incontext.generate_in_context_recall(
        1, 16, 16, max_key_len=2, max_value_len=2, seed=4)),
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_worked_example_matches_the_generator(index):
    module, generate = CASES[index]
    nth = sum(1 for m, _ in CASES[:index] if m is module)  # the module's nth example
    expected = examples(module.__doc__)[nth]
    x, y = generate()
    assert (x[0].tolist(), y[0].tolist()) == expected
