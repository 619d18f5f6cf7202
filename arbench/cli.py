"""``python main.py {fit,validate,test} --config ...``: LightningCLI over LitRecall and the data.

Several ``--config`` files merge left to right, so a method config and a size profile compose::

    python main.py fit --config configs/p4.yaml --config configs/profiles/smoke.yaml
"""

from __future__ import annotations

import os
import sys

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from arbench.allocator import keep_heap
from arbench.data.datamodule import MQARDataModule
from arbench.lit import DivergenceError, LitRecall
from arbench.precision import bf16_warning
from arbench.summary import RunSummary
from arbench.warmstart import WarmStartError

TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
               "init_args": {"save_dir": "runs", "name": "default",
                             "default_hp_metric": False}},
    "use_distributed_sampler": False,  # MQARDataModule shards by itself (no eval padding)
}


def checkpoints_by_run_name(trainer) -> None:
    """Keep checkpoints in ``<save_dir>/<name>/checkpoints`` so ``--ckpt_path last`` finds the
    previous run's ``last.ckpt`` even though each run logs to a new version folder."""
    logger = trainer.logger
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath is None and logger is not None:
            cb.dirpath = os.path.join(logger.save_dir, str(logger.name), "checkpoints")


class ConfigError(ValueError):
    """A configuration value the model or data rejects."""


class ArbenchCLI(LightningCLI):
    """LightningCLI with linked vocab/seed, one-line config errors and resumable checkpoints."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/acc", "checkpoint.mode": "max",
                             "checkpoint.save_last": True, "checkpoint.filename": "best-{step}"})
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.link_arguments("data.vocab_size", "model.vocab_size")
        parser.link_arguments("seed_everything", "model.seed")
        parser.link_arguments("seed_everything", "data.seed")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def before_fit(self) -> None:
        checkpoints_by_run_name(self.trainer)
        slow = bf16_warning(self.trainer.precision, self.trainer.strategy.root_device.type)
        if slow and self.trainer.is_global_zero:
            print(f"warning: {slow}", file=sys.stderr)


def build_cli(args: list[str] | None = None, run: bool = True) -> ArbenchCLI:
    """The CLI over ``LitRecall`` and ``MQARDataModule``; ``run=False`` only instantiates."""
    return ArbenchCLI(LitRecall, MQARDataModule, seed_everything_default=0,
                      trainer_defaults=TRAINER_DEFAULTS, args=args, run=run,
                      save_config_kwargs={"overwrite": True})


def run(args: list[str] | None = None) -> ArbenchCLI | None:
    """Run the CLI; a config or divergence error prints one line and exits non-zero."""
    keep_heap()
    try:
        return build_cli(args)
    except ConfigError as err:
        print(f"error: invalid configuration: {err}", file=sys.stderr)
        sys.exit(2)
    except WarmStartError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except DivergenceError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
