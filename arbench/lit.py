"""LightningModule around the recall model: answer-position loss, accuracy per answer token
and per example (overall and per slice), AdamW with cosine decay, a divergence guard, and
TensorBoard hyperparameters.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from arbench.checkpointing import RNG_KEY, restore_rng_states, rng_states
from arbench.checks import CliError
from arbench.defaults import (
    DEFAULT_N_LAYERS,
    DEFAULT_PRECISION,
    DEFAULT_SHUFFLE,
    recipe_hparams,
)
from arbench.featuremaps import FeatureMap
from arbench.metrics import example_accuracy
from arbench.model import RecallModel
from arbench.optim import make_adamw
from arbench.schedule import LR_SCHEDULES, lr_factor
from arbench.warmstart import warm_start

WEIGHT_DECAY_SCOPES = ("matrices", "all")
"""``weight_decay_scope`` choices: decay matrices only, or every parameter (zoology)."""

class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or gradient; the message names the step and quantity."""


class LitRecall(L.LightningModule):
    """Trains :class:`~arbench.model.RecallModel` on MQAR.

    The feature map is given as a factory ``head_dim -> FeatureMap`` (in YAML a ``class_path``
    with ``init_args`` minus ``head_dim``), so any ``FeatureMap`` subclass works unchanged.
    Batches are ``(inputs (b, n), labels (b, n), slice_index ())`` from
    :class:`~arbench.data.segments.SegmentBatches`.

    Optimiser: AdamW (``lr``, ``betas``, ``weight_decay`` on matrices only or, with
    ``weight_decay_scope="all"``, on every parameter (norms and biases too, as zoology does),
    ``feature_map_weight_decay`` on the feature maps' parameters when given (0: none; decay on
    LLoPS's Θ shrinks a product of p factors like scale^p); the fused kernel on CPU and
    CUDA, :func:`arbench.optim.make_adamw`, except fp16 with clipping). ``lr_schedule``
    (:mod:`arbench.schedule`): ``"cosine"``, linear warm-up for ``warmup_steps``, then cosine
    decay to ``min_lr_ratio * lr`` at the last training step; or ``"zoology"``, cosine over
    epochs stepped once per epoch, no warm-up (``warmup_steps`` and ``min_lr_ratio`` unused).
    ``embedding_dropout``: dropout on the embedding's output while training (zoology: 0.1).
    ``max_position_embeddings``: learned absolute position embeddings added to the token
    embedding for positions below it (0, the default: none); every sequence of the data must
    fit (checked at set-up).
    ``fp32_mixers``: mixer names (of ``mixers``) whose layers compute in fp32 under a mixed
    precision (:func:`arbench.model.run_mixer`); recorded as ``fp32_mixers`` (comma-joined).

    Metrics: ``val/acc`` is the mean over answer tokens (each slice weighs by its answers);
    ``val/example_acc`` is zoology's, the mean over examples of each example's accuracy (equal
    slices weigh the same); both also per slice (``val/acc_<slice>``,
    ``val/example_acc_<slice>``), and ``test/…`` alike.

    ``compile=True`` runs the model body (embedding, blocks, final norm) through
    ``torch.compile``: a one-off compile, then one graph per shape (how it compared with eager
    mode: results/bench/compile/ and results/kernels.md). The head stays eager (it gathers the
    answer positions, a data-dependent shape).

    Backbone options of :class:`~arbench.model.RecallModel`: ``qk_dim`` (width of q and k,
    default ``d_model``), ``attention_eps`` (the denominator's floor), ``block`` (``prenorm``
    or ``zoology``) and ``init_std`` (N(0, init_std²) for every linear map and the embedding).

    ``init_from``: a checkpoint of another run to start from (:func:`arbench.warmstart.warm_start`:
    shared weights copied, a BASED map embedded exactly into this model's affine LLoPS map,
    spare feature columns at ``N(0, init_spare_std²)``), applied at set-up unless the trainer
    restores a checkpoint of this run (resume, test); the optimiser starts fresh.
    """

    def __init__(self, vocab_size: int = 8192, d_model: int = 128,
                 n_layers: int = DEFAULT_N_LAYERS,
                 mixers: list[str] | None = None, num_heads: int = 1,
                 feature_map: Callable[[int], FeatureMap] | None = None,
                 normalize: bool | str = False, output_norm: bool | None = None,
                 chunk_size: int = 64, attention_mode: str = "chunked", conv_kernel: int = 3,
                 use_mlp: bool = False, tie_embeddings: bool = True, lr: float = 1e-3,
                 weight_decay: float = 0.1, warmup_steps: int = 0, min_lr_ratio: float = 0.0,
                 compile: bool = False, seed: int | None = None, init_from: str | None = None,
                 init_spare_std: float = 0.0, feature_map_weight_decay: float | None = None,
                 qk_norm: bool = False, qk_dim: int | None = None, attention_eps: float = 1e-6,
                 block: str = "prenorm", init_std: float | None = None,
                 embedding_dropout: float = 0.0, betas: tuple[float, float] = (0.9, 0.98),
                 weight_decay_scope: str = "matrices", lr_schedule: str = "cosine",
                 fp32_mixers: list[str] | None = None, max_position_embeddings: int = 0):
        super().__init__()
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"model.lr must be a positive number, got {lr!r}")
        if weight_decay < 0 or warmup_steps < 0 or not 0 <= min_lr_ratio <= 1 or (
                feature_map_weight_decay is not None and feature_map_weight_decay < 0):
            raise ValueError("model.weight_decay, model.feature_map_weight_decay and "
                             "model.warmup_steps must be >= 0 and "
                             "model.min_lr_ratio in [0, 1]")
        if weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            raise ValueError(f"model.weight_decay_scope must be one of {WEIGHT_DECAY_SCOPES}, "
                             f"got {weight_decay_scope!r}")
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"model.lr_schedule must be one of {LR_SCHEDULES}, "
                             f"got {lr_schedule!r}")
        betas = tuple(betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(f"model.betas must be two numbers in [0, 1), got {list(betas)!r}")
        self.save_hyperparameters(logger=False)
        mixers = list(mixers) if mixers is not None else ["conv", "linear"]
        self.model = RecallModel(
            vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, mixers=mixers,
            num_heads=num_heads, feature_map=feature_map, normalize=normalize,
            output_norm=output_norm, chunk_size=chunk_size, attention_mode=attention_mode,
            conv_kernel=conv_kernel, use_mlp=use_mlp, tie_embeddings=tie_embeddings,
            qk_norm=qk_norm, qk_dim=qk_dim, attention_eps=attention_eps, block=block,
            init_std=init_std, embedding_dropout=embedding_dropout,
            fp32_mixers=fp32_mixers or (), max_position_embeddings=max_position_embeddings)
        if compile:
            self.model.compile_body()
        self.val_acc = MeanMetric()
        self.example_acc = MeanMetric()
        self.slice_acc = torch.nn.ModuleList()
        self.slice_example_acc = torch.nn.ModuleList()
        self.slice_names: list[str] = []
        self._tokens_seen = 0
        self._t_last: float | None = None
        self._prepared = False
        self._converted: list[str] | None = None  # the warm start's BASED maps, until printed

    # ---- data-dependent set-up -------------------------------------------------------------
    def prepare(self, datamodule: object | None, resuming: bool) -> None:
        """Check the positions against ``datamodule``'s segments and warm start from
        ``init_from`` (unless ``resuming`` from a checkpoint); once. The CLI calls it before
        Lightning's set-up writes the run folder, :meth:`setup` otherwise. Raises
        :class:`CliError` or :class:`~arbench.warmstart.WarmStartError` (one line)."""
        if self._prepared:
            return
        segments = [*getattr(datamodule, "train_segments", []),
                    *getattr(datamodule, "test_segments", [])]
        try:
            self.model.check_positions(max((s.seq_len for s in segments), default=0))
        except ValueError as err:
            raise CliError(str(err)) from None
        if self.hparams.init_from and not resuming:
            self._converted = warm_start(self.model, self.hparams.init_from,
                                         self.hparams.init_spare_std)
        self._prepared = True

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.prepare(dm, resuming=self.trainer.ckpt_path is not None)
        if self._converted is not None and self.trainer.is_global_zero:
            converted, self._converted = self._converted, None
            what = f", {', '.join(converted)} embedded from BASED" if converted else ""
            print(f"initialised from {self.hparams.init_from}{what}")
        names = list(getattr(dm, "slice_names", []))
        if names and names != self.slice_names:
            self.slice_names = names
            self.slice_acc = torch.nn.ModuleList(MeanMetric() for _ in names)
            self.slice_example_acc = torch.nn.ModuleList(MeanMetric() for _ in names)

    def hparams_for_logging(self) -> dict[str, float | int | str | bool]:
        """Flat hyperparameters for the TensorBoard HParams tab and sweep records."""
        hp = dict(self.model.attention_hparams())
        hp.update(d_model=self.hparams.d_model, n_layers=self.hparams.n_layers,
                  num_heads=self.hparams.num_heads, lr=self.hparams.lr,
                  weight_decay=self.hparams.weight_decay,
                  mixers=",".join(self.model.mixer_names),
                  params=sum(p.numel() for p in self.model.parameters()),
                  state_size=self.state_size())
        hp["seed"] = -1 if self.hparams.seed is None else int(self.hparams.seed)
        hp["init_from"] = self.hparams.init_from or ""
        hp["block"] = self.hparams.block
        hp["init_std"] = "default" if self.hparams.init_std is None else f"{self.hparams.init_std:g}"
        fm_decay = self.hparams.feature_map_weight_decay
        hp["feature_map_weight_decay"] = self.hparams.weight_decay if fm_decay is None \
            else fm_decay
        hp.update(recipe_hparams(self.hparams))
        trainer = getattr(self, "_trainer", None)
        hp["precision"] = str(trainer.precision) if trainer is not None else DEFAULT_PRECISION
        hp["fp32_mixers"] = ",".join(self.model.fp32_mixers)
        hp["max_position_embeddings"] = self.model.max_position_embeddings
        hp["shuffle"] = bool(getattr(getattr(trainer, "datamodule", None), "shuffle",
                                     DEFAULT_SHUFFLE))
        return hp

    def state_size(self) -> int:
        """Recurrent state floats at the longest evaluated sequence (see ``RecallModel``)."""
        dm = getattr(getattr(self, "_trainer", None), "datamodule", None)
        seq_len = max((s.seq_len for s in getattr(dm, "test_segments", [])), default=0)
        return self.model.state_size(seq_len)

    def on_fit_start(self) -> None:
        hp = self.hparams_for_logging()
        metrics = {"val/acc": 0.0, "val/example_acc": 0.0,
                   **{f"val/acc_{n}": 0.0 for n in self.slice_names}}
        for logger in self.loggers:
            logger.log_hyperparams(hp, metrics=metrics)
            logger.log_metrics({"model/params": float(hp["params"]),
                                "model/state_size": float(hp["state_size"])}, step=0)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keeps the global random states, so that a run resumed from this checkpoint draws the
        dropout masks an uninterrupted run would (Lightning seeds once, at the start)."""
        checkpoint[RNG_KEY] = rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if RNG_KEY in checkpoint:  # checkpoints written before they kept it have none
            restore_rng_states(checkpoint[RNG_KEY])

    # ---- training --------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        inputs, labels, _ = batch
        logits, targets, _ = self.model.answer_logits(inputs, labels)
        loss = F.cross_entropy(logits.float(), targets)
        if not torch.isfinite(loss):
            raise DivergenceError(f"diverged at step {self.global_step}: training loss is "
                                  f"{loss.item()} (lr={self.hparams.lr})")
        self.log("train/loss", loss, prog_bar=True)
        self._tokens_seen += inputs.numel()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._t_last is not None and self.global_step % 50 == 0 and now > self._t_last:
            self.log("train/tokens_per_s", self._tokens_seen / (now - self._t_last))
            self._tokens_seen, self._t_last = 0, now
        elif self._t_last is None:
            self._tokens_seen, self._t_last = 0, now

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        for name, p in self.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                raise DivergenceError(f"diverged at step {self.global_step}: gradient of "
                                      f"{name} is not finite (lr={self.hparams.lr})")

    # ---- evaluation ------------------------------------------------------------------------
    def _eval_step(self, batch: tuple[torch.Tensor, ...], prefix: str) -> None:
        inputs, labels, slice_index = batch
        logits, targets, rows = self.model.answer_logits(inputs, labels)
        correct = (logits.argmax(dim=-1) == targets).float()
        per_example = example_accuracy(correct, rows, inputs.shape[0])
        self.log(f"{prefix}/loss", F.cross_entropy(logits.float(), targets),
                 batch_size=max(1, targets.numel()), sync_dist=True)
        self.val_acc.update(correct)
        self.example_acc.update(per_example)
        if self.slice_acc:
            self.slice_acc[int(slice_index)].update(correct)
            self.slice_example_acc[int(slice_index)].update(per_example)

    def _eval_epoch_end(self, prefix: str) -> None:
        for metric_name, total, per_slice in (("acc", self.val_acc, self.slice_acc),
                                              ("example_acc", self.example_acc,
                                               self.slice_example_acc)):
            acc = total.compute()
            if not torch.isfinite(acc):
                acc = torch.zeros(())
            self.log(f"{prefix}/{metric_name}", acc, prog_bar=metric_name == "acc")
            total.reset()
            for name, metric in zip(self.slice_names, per_slice):
                with warnings.catch_warnings():  # a slice may have no batch (sanity check): NaN
                    warnings.filterwarnings("ignore", message=".*compute.*before the ``update``")
                    value = metric.compute()  # every rank computes every slice: collective sync
                if torch.isfinite(value):
                    self.log(f"{prefix}/{metric_name}_{name}", value)
                metric.reset()

    def _metrics_in_fp32(self) -> None:
        """Keep the accuracy metrics' running sums in fp32: under ``bf16-true`` / ``16-true``
        Lightning casts the whole module, metric states included, and a bf16 sum of thousands
        of answers stops growing (a mean of 0.80 reads 1.0)."""
        for metric in (self.val_acc, self.example_acc, *self.slice_acc, *self.slice_example_acc):
            metric.set_dtype(torch.float32)

    def on_validation_epoch_start(self) -> None:
        self._metrics_in_fp32()

    def on_test_epoch_start(self) -> None:
        self._metrics_in_fp32()

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    # ---- optimisation ----------------------------------------------------------------------
    def _steps_per_epoch(self, total: int) -> int:
        """Optimiser steps in one epoch of this rank's training loader. Read when the schedule
        is evaluated: the trainer knows the loader's length only once the fit loop has set it
        up (``total``, all the run's steps, until then: the factor at step 0 needs none)."""
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches):
            return total
        return max(1, math.ceil(batches / self.trainer.accumulate_grad_batches))

    def configure_optimizers(self):
        fm_decay = self.hparams.feature_map_weight_decay
        fm_ids = set()
        if fm_decay is not None:
            fm_ids = {id(p) for m in self.modules() if isinstance(m, FeatureMap)
                      for p in m.parameters()}
        fm_params = [p for p in self.parameters() if id(p) in fm_ids and p.requires_grad]
        rest = [p for p in self.parameters() if id(p) not in fm_ids and p.requires_grad]
        decay_all = self.hparams.weight_decay_scope == "all"
        decay = [p for p in rest if decay_all or p.dim() >= 2]
        no_decay = [p for p in rest if not decay_all and p.dim() < 2]
        # fp16 loss scaling with a fused optimizer leaves no room for Lightning's clipping
        clipping = bool(self.trainer.gradient_clip_val) and str(self.trainer.precision) in (
            "16-mixed", "16", "16-true")
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        if fm_params:
            groups.append({"params": fm_params, "weight_decay": fm_decay})
        opt = make_adamw(groups, allow_fused=not clipping, lr=self.hparams.lr,
                         betas=tuple(self.hparams.betas))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        hp = self.hparams
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(
            hp.lr_schedule, step, total, warmup_steps=hp.warmup_steps,
            min_lr_ratio=hp.min_lr_ratio, steps_per_epoch=self._steps_per_epoch(total)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
