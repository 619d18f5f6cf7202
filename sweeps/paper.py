"""The LLoPS paper's reported numbers, to print beside matching rows and claims.

The LLoPS paper's AR accuracies (SPEC.md §4), to print beside matching rows, and its
warm-start result (BASED+LLoPS against BASED+CT) to print beside the warm-start claims. These
are the paper's reported numbers, not arbench measurements.
"""

from __future__ import annotations

from typing import Any

# (feature_map, p, m or r, d_model) -> AR accuracy in %, m = 256 / r = 16 as in the paper.
PAPER_AR: dict[tuple[str, int, int, int], float] = {
    ("LLoPS", 2, 256, 128): 88.7,
    ("LLoPS", 4, 256, 128): 93.2,
    ("LLoPS", 6, 256, 128): 86.6,
    ("LLoPS", 4, 256, 192): 99.0,
    ("Based", 2, 16, 128): 91.9,
    ("Based", 2, 16, 192): 98.1,
}


def paper_value(hp: dict[str, Any]) -> float | None:
    """The paper's accuracy for a row's hyperparameters, or None (rank-1 LLoPS and BASED only)."""
    fm = hp.get("feature_map")
    if fm == "LLoPS" and hp.get("rank", 1) != 1:
        return None
    width = hp.get("r") if fm == "Based" else hp.get("m")
    key = (fm, hp.get("p"), width, hp.get("d_model"))
    return PAPER_AR.get(key)  # type: ignore[arg-type]


# The paper's zero-shot table (../shared/seed/, average accuracy in % over its nine tasks):
# (model size, BASED+CT, BASED+LLoPS), both continued from the same BASED weights.
PAPER_WARMSTART: list[tuple[str, float, float]] = [("360M", 35.00, 36.26), ("1B", 42.16, 42.91)]

PAPER_GAINS = {"warmstart": PAPER_WARMSTART}
"""Reference gains a claim can name with ``paper_gain:``."""


def paper_gain_text(name: str) -> str:
    """The paper's relative gain of the better arm over the worse, e.g. "+3.6% (360M)"."""
    gains = ", ".join(f"{100 * (better / worse - 1):+.1f}% ({size})"
                      for size, worse, better in PAPER_GAINS[name])
    return f"{gains} in average zero-shot accuracy"
