"""One registry of methods: short names for the feature maps and the mixers, and method
configs read for ``python -m arbench.bench`` and ``python -m arbench.approx``.

A method config is any YAML file ``main.py fit`` takes with a ``model.feature_map`` block
(``class_path`` and ``init_args``), e.g. ``configs/p4.yaml``; its class may live outside
arbench (any importable :class:`~arbench.featuremaps.FeatureMap` subclass).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from torch import nn

from arbench.featuremaps import (
    Based,
    CosFormer,
    EluPlusOne,
    FeatureMap,
    Flatten,
    Identity,
    LLoPS,
    Performer,
    PolySketch,
    ReLU,
    Square,
)
from arbench.mixers import (
    BaseConv,
    DeltaAttention,
    FeatureMapAttention,
    GatedDeltaAttention,
    GatedLinearAttention,
    LinearAttention,
    ShortConv,
    SoftmaxAttention,
)

FEATURE_MAPS: Mapping[str, type[FeatureMap]] = MappingProxyType({
    "llops": LLoPS, "based": Based, "flatten": Flatten, "polysketch": PolySketch,
    "elu": EluPlusOne, "identity": Identity, "relu": ReLU, "square": Square,
    "cosformer": CosFormer, "performer": Performer})
"""Short name → feature-map class (the names bench and approx use for the shipped maps)."""

MIXERS: Mapping[str, type[nn.Module]] = MappingProxyType({
    "conv": ShortConv, "base_conv": BaseConv, "linear": LinearAttention,
    "softmax": SoftmaxAttention, "gated": GatedLinearAttention, "delta": DeltaAttention,
    "gated_delta": GatedDeltaAttention})
"""``model.mixers`` name → mixer class."""

FEATURE_MIXERS = tuple(name for name, cls in MIXERS.items()
                       if issubclass(cls, FeatureMapAttention))
"""Mixers built on a feature map (the state updates: linear, gated, delta, gated_delta)."""


def feature_map_class(name: str) -> type[FeatureMap]:
    """The class of a registry name (``llops``), a dotted path (``mypackage.MyMap``) or a
    class of :mod:`arbench.featuremaps` (``LLoPS``); ``ValueError`` unless it names a
    :class:`FeatureMap` subclass."""
    if name in FEATURE_MAPS:
        return FEATURE_MAPS[name]
    module, _, attr = name.rpartition(".")
    module = module or "arbench.featuremaps"
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import feature map {name!r}: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, FeatureMap)):
        raise ValueError(f"{name!r} is not a FeatureMap subclass (a registry name is one of "
                         f"{sorted(FEATURE_MAPS)})")
    return cls


@dataclass(frozen=True)
class MethodConfig:
    """The feature map of a method config: run ``name``, ``class_path``, ``init_args``."""

    name: str
    class_path: str
    init_args: tuple[tuple[str, Any], ...] = ()
    path: str = ""

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.init_args)

    def build(self, head_dim: int) -> FeatureMap:
        """A fresh map for ``head_dim``: ``class_path(head_dim, **init_args)``."""
        return feature_map_class(self.class_path)(head_dim, **self.kwargs)


def check_init_args(cls: type[FeatureMap], init_args: Mapping[str, Any], where: str) -> None:
    """``ValueError`` (one line, starting with ``where``) naming each key of ``init_args`` that
    ``cls(head_dim, ...)`` does not take; a class taking ``**kwargs`` takes any."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # no signature to read: leave it to the call
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = [p.name for p in params[1:]  # the first is head_dim, given by the caller
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(str(k) for k in init_args if k not in known)
    if unknown:
        raise ValueError(f"{where}: {cls.__name__} has no init arg(s) {', '.join(unknown)} "
                         f"(it takes {', '.join(known) or 'none'})")


def load_method_config(path: str | Path) -> MethodConfig:
    """Read a method config's ``model.feature_map`` block and its run name
    (``trainer.logger.init_args.name``, else the file's stem); ``ValueError`` (one line) for a
    missing file or block, a class that is not a FeatureMap, or an init arg it does not take."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ValueError(f"method config {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"method config {path} is not valid YAML: {err}".splitlines()[0]) \
            from None
    block = (raw.get("model") or {}).get("feature_map") if isinstance(raw, dict) else None
    if not isinstance(block, dict) or not block.get("class_path"):
        raise ValueError(f"method config {path} has no model.feature_map block with a "
                         "class_path")
    init_args = block.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise ValueError(f"method config {path}: model.feature_map.init_args must be a mapping")
    check_init_args(feature_map_class(str(block["class_path"])), init_args,
                    f"method config {path}: model.feature_map.init_args")
    logger = ((raw.get("trainer") or {}).get("logger") or {})
    name = ((logger.get("init_args") or {}).get("name") if isinstance(logger, dict) else None)
    return MethodConfig(str(name or path.stem), str(block["class_path"]),
                        tuple(sorted(init_args.items())), str(path))


__all__ = ["FEATURE_MAPS", "FEATURE_MIXERS", "MIXERS", "MethodConfig", "check_init_args",
           "feature_map_class", "load_method_config"]
