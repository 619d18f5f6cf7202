"""On a grid, a pruner decides within the trial's bracket (same point and seed, any lr)."""

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.pruning import BracketPruner


def finished(p, lr, seed, values):
    params = {"p": p, "model.lr": lr, "seed_everything": seed}
    dists = {"p": IntDistribution(p, p), "model.lr": FloatDistribution(lr, lr),
             "seed_everything": IntDistribution(seed, seed)}
    return create_trial(state=TrialState.COMPLETE, params=params, distributions=dists,
                        value=values[-1],
                        intermediate_values={100 * (i + 1): v for i, v in enumerate(values)})


def running(study, p, lr, seed, values):
    trial = study.ask({"p": IntDistribution(p, p), "model.lr": FloatDistribution(lr, lr),
                       "seed_everything": IntDistribution(seed, seed)})
    for i, v in enumerate(values):
        trial.report(v, 100 * (i + 1))
    return trial


def test_only_the_trials_bracket_decides():
    median = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    study = optuna.create_study(direction="maximize", pruner=BracketPruner(median))
    study.add_trial(finished(2, 1e-3, 0, [0.8, 0.9]))   # another point: p=2
    study.add_trial(finished(6, 1e-3, 1, [0.8, 0.9]))   # the same point, another seed
    slow = running(study, 6, 3e-3, 0, [0.1, 0.2])
    assert not slow.should_prune()                      # nothing in its bracket has finished
    study.add_trial(finished(6, 3e-4, 0, [0.5, 0.6]))   # its bracket: p=6, seed 0
    slower = running(study, 6, 1e-2, 0, [0.1, 0.2])
    assert slower.should_prune()
    # without brackets the p=2 run alone would already have stopped the first one
    plain = optuna.create_study(direction="maximize", pruner=median)
    plain.add_trial(finished(2, 1e-3, 0, [0.8, 0.9]))
    assert running(plain, 6, 3e-3, 0, [0.1, 0.2]).should_prune()


def test_a_widened_lr_runs_its_whole_budget():
    # the bracket's three grid lrs finished; an lr added below the grid by --widen starts
    # slower than all of them but is never stopped, while a grid lr that slow would be
    halving = optuna.pruners.SuccessiveHalvingPruner(min_resource=100, reduction_factor=3)
    study = optuna.create_study(direction="maximize",
                                pruner=BracketPruner(halving, grid_lrs=[3e-4, 1e-3, 3e-3]))
    for lr in (3e-4, 1e-3, 3e-3):  # each passes the first rung (step 100) at 0.5
        grid_run = running(study, 2, lr, 0, [0.5])
        assert not grid_run.should_prune()
        study.tell(grid_run, 0.9)
    assert not running(study, 2, 9e-5, 0, [0.1]).should_prune()
    assert running(study, 2, 3e-3, 0, [0.1]).should_prune()


def test_the_pruning_callback_judges_a_step_before_its_checkpoint_is_written(tmp_path):
    """A worker's pruning callback goes before the checkpoint callbacks the CLI built, so a
    run killed after a validation's checkpoint has already reported that validation."""
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint
    from paths import SMOKE, config

    from arbench.cli import build_cli
    from sweeps.pruning import before_checkpoints

    cli = build_cli(["--config", config("p4.yaml"), *SMOKE, "--trainer.default_root_dir",
                     str(tmp_path)], run=False)
    judge = Callback()
    before_checkpoints(cli.trainer.callbacks, judge)
    order = cli.trainer.callbacks
    first = min(i for i, c in enumerate(order) if isinstance(c, ModelCheckpoint))
    assert order.index(judge) == first - 1
