"""LightningModule around the recall model: answer-position loss, micro accuracy per slice,
AdamW with cosine decay, a divergence guard, and TensorBoard hyperparameters.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from arbench.featuremaps import FeatureMap
from arbench.model import RecallModel
from arbench.optim import make_adamw
from arbench.warmstart import warm_start


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or gradient; the message names the step and quantity."""


class LitRecall(L.LightningModule):
    """Trains :class:`~arbench.model.RecallModel` on MQAR.

    The feature map is given as a factory ``head_dim -> FeatureMap`` (in YAML a ``class_path``
    with ``init_args`` minus ``head_dim``), so any ``FeatureMap`` subclass works unchanged.
    Batches are ``(inputs (b, n), labels (b, n), slice_index ())`` from
    :class:`~arbench.data.segments.SegmentBatches`.

    Optimiser: AdamW (``lr``, ``weight_decay`` on matrices only, ``feature_map_weight_decay``
    on the feature maps' parameters when given (0: none; decay on LLoPS's Θ shrinks a product of
    p factors like scale^p); the fused kernel on CPU and
    CUDA, :func:`arbench.optim.make_adamw`, except fp16 with clipping), linear warm-up for
    ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` at the last training step.

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

    def __init__(self, vocab_size: int = 8192, d_model: int = 128, n_layers: int = 2,
                 mixers: list[str] | None = None, num_heads: int = 1,
                 feature_map: Callable[[int], FeatureMap] | None = None,
                 normalize: bool | str = False, output_norm: bool | None = None,
                 chunk_size: int = 64, attention_mode: str = "chunked", conv_kernel: int = 3,
                 use_mlp: bool = False, tie_embeddings: bool = True, lr: float = 1e-3,
                 weight_decay: float = 0.1, warmup_steps: int = 0, min_lr_ratio: float = 0.0,
                 compile: bool = False, seed: int | None = None, init_from: str | None = None,
                 init_spare_std: float = 0.0, feature_map_weight_decay: float | None = None,
                 qk_norm: bool = False, qk_dim: int | None = None, attention_eps: float = 1e-6,
                 block: str = "prenorm", init_std: float | None = None):
        super().__init__()
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"model.lr must be a positive number, got {lr!r}")
        if weight_decay < 0 or warmup_steps < 0 or not 0 <= min_lr_ratio <= 1 or (
                feature_map_weight_decay is not None and feature_map_weight_decay < 0):
            raise ValueError("model.weight_decay, model.feature_map_weight_decay and "
                             "model.warmup_steps must be >= 0 and "
                             "model.min_lr_ratio in [0, 1]")
        self.save_hyperparameters(logger=False)
        mixers = list(mixers) if mixers is not None else ["conv", "linear"]
        self.model = RecallModel(
            vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, mixers=mixers,
            num_heads=num_heads, feature_map=feature_map, normalize=normalize,
            output_norm=output_norm, chunk_size=chunk_size, attention_mode=attention_mode,
            conv_kernel=conv_kernel, use_mlp=use_mlp, tie_embeddings=tie_embeddings,
            qk_norm=qk_norm, qk_dim=qk_dim, attention_eps=attention_eps, block=block,
            init_std=init_std)
        if compile:
            self.model.compile_body()
        self.val_acc = MeanMetric()
        self.slice_acc = torch.nn.ModuleList()
        self.slice_names: list[str] = []
        self._tokens_seen = 0
        self._t_last: float | None = None

    # ---- data-dependent set-up -------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.hparams.init_from and self.trainer.ckpt_path is None:
            converted = warm_start(self.model, self.hparams.init_from,
                                   self.hparams.init_spare_std)
            if self.trainer.is_global_zero:
                what = f", {', '.join(converted)} embedded from BASED" if converted else ""
                print(f"initialised from {self.hparams.init_from}{what}")
        dm = getattr(self.trainer, "datamodule", None)
        names = list(getattr(dm, "slice_names", []))
        if names and names != self.slice_names:
            self.slice_names = names
            self.slice_acc = torch.nn.ModuleList(MeanMetric() for _ in names)

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
        return hp

    def state_size(self) -> int:
        """Recurrent state floats at the longest evaluated sequence (see ``RecallModel``)."""
        dm = getattr(getattr(self, "_trainer", None), "datamodule", None)
        seq_len = max((s.seq_len for s in getattr(dm, "test_segments", [])), default=0)
        return self.model.state_size(seq_len)

    def on_fit_start(self) -> None:
        hp = self.hparams_for_logging()
        metrics = {"val/acc": 0.0, **{f"val/acc_{n}": 0.0 for n in self.slice_names}}
        for logger in self.loggers:
            logger.log_hyperparams(hp, metrics=metrics)
            logger.log_metrics({"model/params": float(hp["params"]),
                                "model/state_size": float(hp["state_size"])}, step=0)

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
        logits, targets, _ = self.model.answer_logits(inputs, labels)
        correct = (logits.argmax(dim=-1) == targets).float()
        self.log(f"{prefix}/loss", F.cross_entropy(logits.float(), targets),
                 batch_size=max(1, targets.numel()), sync_dist=True)
        self.val_acc.update(correct)
        if self.slice_acc:
            self.slice_acc[int(slice_index)].update(correct)

    def _eval_epoch_end(self, prefix: str) -> None:
        acc = self.val_acc.compute()
        if not torch.isfinite(acc):
            acc = torch.zeros(())
        self.log(f"{prefix}/acc", acc, prog_bar=True)
        self.val_acc.reset()
        for name, metric in zip(self.slice_names, self.slice_acc):
            with warnings.catch_warnings():  # a slice may have no batch (sanity check): NaN
                warnings.filterwarnings("ignore", message=".*compute.*before the ``update``")
                value = metric.compute()  # every rank computes every slice: the sync is collective
            if torch.isfinite(value):
                self.log(f"{prefix}/acc_{name}", value)
            metric.reset()

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    # ---- optimisation ----------------------------------------------------------------------
    def configure_optimizers(self):
        fm_decay = self.hparams.feature_map_weight_decay
        fm_ids = set()
        if fm_decay is not None:
            fm_ids = {id(p) for m in self.modules() if isinstance(m, FeatureMap)
                      for p in m.parameters()}
        fm_params = [p for p in self.parameters() if id(p) in fm_ids and p.requires_grad]
        rest = [p for p in self.parameters() if id(p) not in fm_ids and p.requires_grad]
        decay = [p for p in rest if p.dim() >= 2]
        no_decay = [p for p in rest if p.dim() < 2]
        # fp16 loss scaling with a fused optimizer leaves no room for Lightning's clipping
        clipping = bool(self.trainer.gradient_clip_val) and str(self.trainer.precision) in (
            "16-mixed", "16", "16-true")
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        if fm_params:
            groups.append({"params": fm_params, "weight_decay": fm_decay})
        opt = make_adamw(groups,
                         allow_fused=not clipping, lr=self.hparams.lr, betas=(0.9, 0.98))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            progress = min(1.0, (step - warm) / max(1, total - warm))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
