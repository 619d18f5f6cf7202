"""``python main.py {fit,validate,test} --config ...``: LightningCLI over LitRecall and the data.

A method config, a size config and a profile compose (they set disjoint keys, so their order
does not matter); with no profile, the ``cpu`` profile is read first (:mod:`arbench.profiles`)::

    python main.py fit --config configs/p4.yaml --config configs/profiles/smoke.yaml \
        --config configs/sizes/tiny.yaml

Bad input stops before anything is written, with one line ``error: ...`` on stderr: config
files and parser errors (:mod:`arbench.cli_errors`), a checkpoint that disagrees with the
configuration (:mod:`arbench.ckpt_check`), an unwritable output folder, a value the model, data
or trainer rejects, a model too large for memory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from arbench.checkpointing import LatestCheckpoint
from arbench.checks import CliError, check_writable
from arbench.ckpt_check import check_checkpoint, last_checkpoint
from arbench.cli_errors import check_config_files, short_parser_message
from arbench.data.datamodule import MQARDataModule
from arbench.kernels import keep_heap
from arbench.lit import DivergenceError, LitRecall
from arbench.noise import (
    quiet_evaluation_dirpath_warning,
    quiet_known_noise,
    quiet_resume_warning,
)
from arbench.precision import bf16_warning
from arbench.profiles import default_profile_note, with_default_profile
from arbench.report import EndOfRunReport
from arbench.summary import RunSummary
from arbench.warmstart import WarmStartError

TRAINER_DEFAULTS = {
    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
               "init_args": {"save_dir": "runs", "name": "default",
                             "default_hp_metric": False}},
    "use_distributed_sampler": False,  # MQARDataModule shards by itself (no eval padding)
}
GiB = 2**30
SIGTERM_EXIT = 143
"""Exit status of a run stopped by SIGTERM (``kill <pid>``): 128 + 15, as a shell reports it."""


def checkpoints_by_run_name(trainer) -> None:
    """Keep checkpoints in ``<save_dir>/<name>/checkpoints`` so ``--ckpt_path last`` finds the
    previous run's ``last.ckpt`` even though each run logs to a new version folder."""
    logger = trainer.logger
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath is None and logger is not None:
            cb.dirpath = os.path.join(logger.save_dir, str(logger.name), "checkpoints")


class ConfigError(CliError):
    """A configuration value the model, data or trainer rejects."""


class ArbenchParser(LightningArgumentParser):
    """Parser whose errors are one line naming the key (and a pointer to ``--help``) instead
    of the usage dump and jsonargparse's Union details."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {short_parser_message(message)}\n"
                         f"(run `{prog} --help` for the accepted options)\n")
        sys.exit(2)


def _logger_dirs(logger) -> list[str]:
    """``save_dir`` of each configured logger (a class_path/init_args mapping or a list)."""
    loggers = logger if isinstance(logger, list) else [logger]
    dirs = []
    for item in loggers:
        init = item.get("init_args") if hasattr(item, "get") else None
        save_dir = init.get("save_dir") if init is not None else None
        if save_dir:
            dirs.append(str(save_dir))
    return dirs


def _checkpoint_dir(cfg) -> Path | None:
    """Where ``ModelCheckpoint`` writes: ``checkpoint.dirpath`` or, as
    :func:`checkpoints_by_run_name` sets it, ``<save_dir>/<name>/checkpoints``."""
    if cfg.get("checkpoint") is not None and cfg.checkpoint.get("dirpath"):
        return Path(cfg.checkpoint.dirpath)
    logger = cfg.trainer.get("logger")
    init = logger.get("init_args") if hasattr(logger, "get") else None
    if init is None or not init.get("save_dir"):
        return None
    return Path(init.save_dir) / str(init.get("name") or "lightning_logs") / "checkpoints"


class ArbenchCLI(LightningCLI):
    """LightningCLI with linked vocab/seed, one-line errors, resumable checkpoints, a default
    profile and a report of what each run found (:mod:`arbench.report`)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands but ``predict`` (LitRecall has no prediction step)."""
        return {name: skip for name, skip in LightningCLI.subcommands().items()
                if name != "predict"}

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(LatestCheckpoint, "checkpoint")
        # no version counter: every run of a name writes the same last.ckpt (the latest run's)
        parser.set_defaults({"checkpoint.monitor": "val/acc", "checkpoint.mode": "max",
                             "checkpoint.save_last": True, "checkpoint.filename": "best-{step}",
                             "checkpoint.enable_version_counter": False})
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.link_arguments("data.vocab_size", "model.vocab_size")
        parser.link_arguments("seed_everything", "model.seed")
        parser.link_arguments("seed_everything", "data.seed")

    def parse_arguments(self, parser, args) -> None:
        """Check the config files first (empty, not YAML), read the default profile when none
        is given (:mod:`arbench.profiles`) and, after parsing, check the outputs and the
        checkpoint, all before anything is instantiated or written."""
        argv = sys.argv[1:] if args is None else args
        defaulted = False
        if isinstance(argv, (list, tuple)):
            argv = [str(a) for a in argv]
            check_config_files(argv)
            argv, defaulted = with_default_profile(argv, self.subcommands())
        if defaulted:  # parsed here: Lightning warns when given args beside a command line
            print(default_profile_note(), file=sys.stderr)
            self.config = parser.parse_args(argv)
        else:
            super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:
            self._check_run(subcommand, self.config[subcommand])

    def _check_run(self, subcommand: str, cfg) -> None:
        for save_dir in _logger_dirs(cfg.trainer.get("logger")):
            check_writable(save_dir, "--trainer.logger.init_args.save_dir")
        interval = cfg.trainer.get("val_check_interval")
        if isinstance(interval, (int, float)) and not interval > 0:  # or a time (str, dict)
            raise CliError(f"--trainer.val_check_interval must be > 0 (training steps, or a "
                           f"fraction of an epoch), got {interval}")
        ckpt_path = cfg.get("ckpt_path")
        if ckpt_path == "best":
            raise CliError("--ckpt_path best needs a fit in this process; give a checkpoint "
                           "file or `last`")
        if cfg.get("weights_only") is False:
            raise CliError("--weights_only false would let a checkpoint run code when it is "
                           "loaded: arbench loads checkpoints as tensors only (leave it out)")
        if ckpt_path == "last":
            ckpt_dir = _checkpoint_dir(cfg)
            if ckpt_dir is None:
                return
            found = last_checkpoint(ckpt_dir)
            if found is None:
                print(f"note: --ckpt_path last: nothing to resume in {ckpt_dir}; starting fresh",
                      file=sys.stderr)
                cfg.ckpt_path = None
                return
            ckpt_path = str(found)
        elif ckpt_path in (None, "hpc") or str(ckpt_path).startswith("registry"):
            return
        check_checkpoint(str(ckpt_path), subcommand, cfg.model.as_dict())

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except MisconfigurationException as err:
            raise ConfigError(str(err).strip().splitlines()[0]) from None
        except ValueError as err:
            raise ConfigError(str(err)) from None
        except (RuntimeError, MemoryError) as err:
            if not _is_allocation_failure(err):
                raise
            raise CliError(self._memory_message()) from None

    def _memory_message(self) -> str:
        """The model's parameter memory (built again on the meta device) against the RAM."""
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            with torch.device("meta"):
                model = self._get(self.parser.instantiate_classes(self.config), "model")
            size = sum(t.numel() * t.element_size()
                       for t in [*model.parameters(), *model.buffers()])
            need = f"its parameters alone take {size / GiB:.1f} GiB"
        except Exception:
            need = "building it failed to allocate memory"
        return (f"the model does not fit in memory: {need}, this machine has {ram / GiB:.1f} GiB "
                "(check sizes such as model.d_model and model.feature_map.init_args.m)")

    def _report_at_the_end(self) -> None:
        """Add the callback that prints what the run found when it ends or is stopped."""
        if not any(isinstance(cb, EndOfRunReport) for cb in self.trainer.callbacks):
            self.trainer.callbacks.append(EndOfRunReport())

    def _prepare_model(self) -> None:
        """The model's checks that need the data and its warm start (``init_from``), before
        Lightning's set-up creates the run folder, so that they fail with nothing written."""
        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        self.model.prepare(self.datamodule, resuming=ckpt_path is not None)

    def _note_replaced_last(self) -> None:
        """Say which ``last.ckpt`` of an earlier run this fit will replace (not one it
        resumes)."""
        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        for cb in self.trainer.checkpoint_callbacks:
            if not (isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath):
                continue
            last = Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
            resumed = ckpt_path == "last" or (
                ckpt_path is not None and Path(ckpt_path).resolve() == last.resolve())
            if last.is_file() and not resumed and self.trainer.is_global_zero:
                print(f"note: this fit replaces {last}, an earlier run's last checkpoint "
                      "(--ckpt_path last would resume it)", file=sys.stderr)

    def before_fit(self) -> None:
        self._prepare_model()
        checkpoints_by_run_name(self.trainer)
        self._note_replaced_last()
        self._report_at_the_end()
        slow = bf16_warning(self.trainer.precision, self.trainer.strategy.root_device.type)
        if slow and self.trainer.is_global_zero:
            print(f"warning: {slow}", file=sys.stderr)
        if self.config[self.subcommand].get("ckpt_path") is not None:
            quiet_resume_warning()

    def before_validate(self) -> None:
        self._prepare_model()
        checkpoints_by_run_name(self.trainer)  # else Lightning warns that the dirpath changed
        self._report_at_the_end()
        quiet_evaluation_dirpath_warning()  # as it does for a checkpoint from another folder

    def before_test(self) -> None:
        self._prepare_model()
        checkpoints_by_run_name(self.trainer)
        self._report_at_the_end()
        quiet_evaluation_dirpath_warning()


def _is_allocation_failure(err: BaseException) -> bool:
    text = str(err)
    return (isinstance(err, (MemoryError, torch.OutOfMemoryError))
            or "can't allocate memory" in text or "out of memory" in text.lower())


def build_cli(args: list[str] | None = None, run: bool = True,
              cli_class: type[ArbenchCLI] = ArbenchCLI) -> ArbenchCLI:
    """The CLI over ``LitRecall`` and ``MQARDataModule``; ``run=False`` only instantiates.
    ``cli_class``: a subclass of :class:`ArbenchCLI` (``sweeps.reuse`` parses without
    building), so every caller parses ``main.py``'s arguments the same way."""
    return cli_class(LitRecall, MQARDataModule, seed_everything_default=0,
                     trainer_defaults=TRAINER_DEFAULTS, args=args, run=run,
                     parser_class=ArbenchParser, save_config_kwargs={"overwrite": True})


def run(args: list[str] | None = None) -> ArbenchCLI | None:
    """Run the CLI; bad input or a divergence prints one line and exits non-zero; a fit
    stopped by SIGTERM exits with :data:`SIGTERM_EXIT` (its report says so)."""
    keep_heap()
    quiet_known_noise()
    try:
        return build_cli(args)
    except ConfigError as err:
        print(f"error: invalid configuration: {err}", file=sys.stderr)
        sys.exit(2)
    except (CliError, WarmStartError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except DivergenceError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    except SIGTERMException:  # a SystemExit without a code: it would exit 0
        sys.exit(SIGTERM_EXIT)
