"""The training recipe's defaults, as the model takes them and as a run's hparams record them.

No torch or Lightning here: the LightningModule (:mod:`arbench.lit`) and the sweep reports
(:mod:`sweeps.labels`) both read these, and the reports must start without torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RECIPE_DEFAULTS: dict[str, Any] = {"embedding_dropout": 0.0, "betas": (0.9, 0.98),
                                   "weight_decay_scope": "matrices", "lr_schedule": "cosine"}
"""The training-recipe switches and their defaults (``configs/recipes/zoology.yaml`` sets
zoology's: 0.1, (0.9, 0.999), ``all``, ``zoology``; data order: ``data.shuffle``)."""

DEFAULT_SHUFFLE = True
"""``data.shuffle``'s default: batches of every segment in one seeded shuffled order."""

DEFAULT_PRECISION = "32-true"
"""The trainer's precision when none is given."""

DEFAULT_N_LAYERS = 2
"""``model.n_layers``'s default: a conv block, then an attention block (the sweep reports name
other depths in a row's label)."""


def betas_text(betas: Iterable[float]) -> str:
    """AdamW's betas as a run's hparams record them, e.g. ``"0.9,0.98"``."""
    return ",".join(f"{b:g}" for b in betas)


def recipe_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe switches of ``hparams`` as flat hparams (``betas`` as ``"0.9,0.98"``)."""
    out = {k: hparams.get(k, v) for k, v in RECIPE_DEFAULTS.items()}
    out["betas"] = betas_text(out["betas"])
    return out


TRAINING_DEFAULTS: dict[str, Any] = {**recipe_hparams({}), "shuffle": DEFAULT_SHUFFLE,
                                     "precision": DEFAULT_PRECISION, "fp32_mixers": "",
                                     "max_position_embeddings": 0}
"""How a run trained, as hparams, when its hparams do not say (runs recorded before these were
hparams)."""

ZOOLOGY_RECIPE: dict[str, Any] = {**recipe_hparams({"embedding_dropout": 0.1,
                                                    "betas": (0.9, 0.999),
                                                    "weight_decay_scope": "all",
                                                    "lr_schedule": "zoology"}),
                                  "shuffle": False}
"""The hparams of ``configs/recipes/zoology.yaml``."""
