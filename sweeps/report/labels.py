"""Row names and hparam filters of the sweep reports.

Row names and hparam filters of the sweep reports: a row's label from its hparams, and
whether its hparams match a ``where:`` / claim selector.
"""

from __future__ import annotations

import math
from typing import Any

from arbench.defaults import DEFAULT_N_LAYERS, TRAINING_DEFAULTS, ZOOLOGY_RECIPE
from arbench.registry import FEATURE_MIXERS

TASK_MODEL_KEYS = ("max_position_embeddings", "n_layers")
"""The model settings a task's profile may set for every method alike (tests/test_configs.py
holds the profiles to them)."""


def label(hp: dict[str, Any]) -> str:
    """Row name: method and its sizes, plus the denominator when there is one, and the task's
    difficulty setting where a spec trains one run per setting (``" on copy_64"``)."""
    fm = hp.get("feature_map", "?")
    at = f" on {hp['setting']}" if hp.get("setting") else ""
    if fm == "Based":
        text = f"BASED r={hp.get('r')}"
    elif fm == "softmax":  # no map, no sizes; what it was trained with still shows
        return "softmax" + variant(hp) + training_label(hp) + at
    else:  # a map's sizes, those it has (elu+1 has no degree: its m is the head dim)
        sizes = [f"{k}={hp[k]}" for k in ("p", "m") if hp.get(k) is not None]
        text = " ".join([fm, *sizes])
        text += f" t={hp['rank']}" if fm == "LLoPS" else ""
    norm = hp.get("normalize")
    text += f" denominator={norm}" if norm not in (None, "none") else ""
    return text + variant(hp) + training_label(hp) + at


def with_training_defaults(hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` with :data:`arbench.defaults.TRAINING_DEFAULTS` filled in where it holds no
    value."""
    return {**TRAINING_DEFAULTS, **{k: v for k, v in hp.items() if v is not None}}


def training_label(hp: dict[str, Any]) -> str:
    """How a row's runs were trained where it is not arbench's default, e.g.
    ``" zoology recipe bf16-mixed"``: the recipe switches (all of zoology's as one name), then
    the precision (and the mixers kept in fp32 under it, e.g. ``"(conv in fp32)"``). Runs
    recorded before these were hparams count as the defaults."""
    hp = with_training_defaults(hp)
    parts = []
    if all(hp[k] == v for k, v in ZOOLOGY_RECIPE.items()):
        parts.append("zoology recipe")
    else:
        if hp["embedding_dropout"]:
            parts.append(f"emb-dropout {hp['embedding_dropout']:g}")
        if hp["betas"] != TRAINING_DEFAULTS["betas"]:
            parts.append(f"betas {hp['betas']}")
        if hp["weight_decay_scope"] != "matrices":
            parts.append("wd on all params")
        if hp["lr_schedule"] != "cosine":
            parts.append(f"{hp['lr_schedule']} schedule")
        if not hp["shuffle"]:
            parts.append("unshuffled")
    if hp["precision"] not in ("32-true", "32"):
        parts.append(str(hp["precision"]))
        if hp["fp32_mixers"]:
            parts.append(f"({hp['fp32_mixers']} in fp32)")
    return "".join(f" {p}" for p in parts)


def variant(hp: dict[str, Any]) -> str:
    """The diagnosis switches a row's run used, e.g. ``" qk-norm affine"`` (empty: none)."""
    parts = [name for name, on in (("qk-norm", hp.get("qk_norm")), ("φ²", hp.get("square")),
                                   ("affine", hp.get("affine"))) if on]
    rules = [m for m in str(hp.get("mixers", "")).split(",")
             if m in FEATURE_MIXERS and m != "linear"]
    parts += [f"[{rule}]" for rule in dict.fromkeys(rules)]  # gated / delta state updates
    if hp.get("init_from"):
        parts.append("(warm start)")
    if hp.get("block") == "zoology":
        parts.append("zoology block")
    if hp.get("max_position_embeddings"):
        parts.append("pos-emb")
    if hp.get("n_layers") not in (None, DEFAULT_N_LAYERS):
        parts.append(f"{hp['n_layers']} layers")
    if hp.get("init_std") not in (None, "default"):
        parts.append(f"init N(0, {hp['init_std']}²)")
    if hp.get("init") not in (None, "variance"):
        parts.append(f"init {hp['init']}")
    wd, fm_wd = hp.get("weight_decay"), hp.get("feature_map_weight_decay")
    if fm_wd is not None and wd is not None and fm_wd != wd:
        parts.append(f"feature-map wd={fm_wd:g}")
    return "".join(f" {p}" for p in parts)


def task_model(hp: dict[str, Any]) -> str:
    """What of :data:`TASK_MODEL_KEYS` a run's model set, as :func:`variant` names it, e.g.
    ``"pos-emb 4 layers"`` (empty: the defaults)."""
    return variant({k: hp.get(k) for k in TASK_MODEL_KEYS}).strip()


def variant_name(hp: dict[str, Any]) -> str:
    """:func:`variant` as a name, e.g. ``"qk-norm"``; ``"baseline"`` for none."""
    return variant(hp).strip() or "baseline"


def mixers_cycle(layers: str, pattern: str) -> bool:
    """Whether the comma-joined per-layer mixers ``layers`` (a run's ``mixers`` hparam) are
    ``pattern`` repeated: a model cycles its ``mixers`` list over its layers, so a 4-layer
    ``conv,delta,conv,delta`` is the ``conv,delta`` model a 2-layer profile records as such."""
    have, cycle = layers.split(","), pattern.split(",")
    return len(have) % len(cycle) == 0 and have == cycle * (len(have) // len(cycle))


def hparams_match(hp: dict[str, Any], key: str, want: Any) -> bool:
    """``hp[key] == want`` (or ``in want`` for a list); ``"m*rank"`` multiplies hparams;
    ``"variant"`` is the row's diagnosis switches as its label names them
    (:func:`variant_name`); ``"mixers"`` matches a run whose layers repeat the wanted mixers
    (:func:`mixers_cycle`)."""
    if key == "variant":
        name = variant_name(hp)
        return name in want if isinstance(want, list) else name == want
    if key == "mixers" and isinstance(hp.get("mixers"), str):
        wants = want if isinstance(want, list) else [want]
        return any(isinstance(w, str) and mixers_cycle(hp["mixers"], w) for w in wants)
    hp = with_training_defaults(hp)
    names = key.split("*")
    if any(hp.get(n) is None for n in names):
        return False
    value = math.prod(hp[n] for n in names) if len(names) > 1 else hp[key]
    return value in want if isinstance(want, list) else value == want


def matches_all(hp: dict[str, Any], where: dict[str, Any]) -> bool:
    """:func:`hparams_match` of every ``key: want`` of ``where``."""
    return all(hparams_match(hp, k, v) for k, v in where.items())
