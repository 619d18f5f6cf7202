"""Successive halving replayed on recorded curves: brackets per point and seed, steps, lr."""

from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.halving import halving_text, replay

STEPS = list(range(250, 3001, 250))


def run(number, p, lr, seed, rate):
    """A finished run whose val/acc climbs at ``rate`` per validation, capped at 1."""
    curve = [[s, min(1.0, rate * (i + 1))] for i, s in enumerate(STEPS)]
    params = {"p": p, "model.lr": lr, "seed_everything": seed}
    dists = {"p": IntDistribution(p, p), "model.lr": FloatDistribution(lr, lr),
             "seed_everything": IntDistribution(seed, seed)}
    t = create_trial(state=TrialState.COMPLETE, params=params, distributions=dists,
                     value=max(v for _, v in curve),
                     user_attrs={"val_curve": curve, "global_step": STEPS[-1]})
    t.number = number
    return t


def grid(rates):
    """``rates[p][lr_index]`` for seeds 0 and 1, in the order a sweep queues them."""
    trials = []
    for p, by_lr in rates.items():
        for seed in (0, 1):
            for lr, rate in zip((3e-4, 1e-3, 3e-3), by_lr):
                trials.append(run(len(trials), p, lr, seed, rate + 0.001 * seed))
    return trials


def test_halving_stops_the_slow_lrs_and_keeps_the_best():
    # p=2: the first lr run is the best, so the later, slower ones are stopped at a rung
    trials = grid({2: [0.08, 0.02, 0.01]})
    [point] = replay(trials, args={"min_resource": 500, "reduction_factor": 3})
    assert point.best_full == point.best_halving == 3e-4
    assert point.pruned and all(lr != 3e-4 for lr, _ in point.pruned)
    assert point.steps_full == 6 * 3000
    assert point.steps_halving == 2 * 3000 + sum(point.pruned.values()) + \
        sum(3000 for lr in (1e-3, 3e-3) for seed in (0, 1) if (lr, seed) not in point.pruned)
    assert point.steps_halving < point.steps_full


def test_points_never_compete_with_each_other():
    # p=6 learns far slower than p=2 at every lr; in one shared bracket its runs would be
    # stopped, but each point has its own brackets, so p=6's first lr always finishes
    trials = grid({2: [0.1, 0.09, 0.08], 6: [0.001, 0.002, 0.003]})
    replays = {dict(r.point)["p"]: r for r in replay(trials, args={"min_resource": 500,
                                                                   "reduction_factor": 3})}
    assert (3e-4, 0) not in replays["6"].pruned and (3e-4, 1) not in replays["6"].pruned
    text = "\n".join(halving_text(list(replays.values()), {"reduction_factor": 3}))
    assert "| p=2 |" in text and "| p=6 |" in text and "training steps" in text


def curve_run(number, lr, seed, curve):
    """A finished p=2 run with the given val/acc ``curve`` at STEPS."""
    t = run(number, 2, lr, seed, 0.1)
    t.user_attrs["val_curve"] = [[s, v] for s, v in zip(STEPS, curve)]
    t.value = max(curve)
    return t


def test_order_checks_find_a_rung_that_depends_on_which_lr_runs_first():
    from sweeps.halving import order_checks

    # lr 1e-3 starts fast and stalls at 0.8; lr 3e-4 starts slowly and ends best (0.95):
    # a first rung at step 500 stops 3e-4 whenever 1e-3 has passed that rung before it
    fast = [0.5, 0.6, 0.7, 0.75] + [0.8] * 8
    slow = [0.05, 0.1, 0.3, 0.5, 0.7, 0.85] + [0.95] * 6  # ahead again by step 1500
    trials = [curve_run(2 * seed + i, lr, seed, c) for seed in (0, 1)
              for i, (lr, c) in enumerate(((3e-4, slow), (1e-3, fast)))]
    early, half = order_checks(trials, "maximize", {"reduction_factor": 3},
                               fractions=(1 / 6, 1 / 2))
    assert early.min_resource == 500 and half.min_resource == 1500
    assert sorted(early.kept) == [0, 1]  # slow first: kept; fast first: lost
    assert half.kept == [1, 1] and half.points == 1


def test_halving_md_only_for_points_that_tried_two_or_more_lrs(tmp_path):
    from types import SimpleNamespace

    from sweeps.halving import write_halving

    spec = SimpleNamespace(pruner="none", direction="maximize", metric="val/acc")
    # every point at one lr of its own (as rank's cpu grid sets each p's lr): no halving.md
    one_lr = [run(0, 2, 3e-4, 0, 0.1), run(1, 6, 1e-3, 0, 0.05)]
    assert write_halving(spec, one_lr, tmp_path) == []
    assert not (tmp_path / "halving.md").exists()
    # a point of three lrs beside one of a single lr: only the first is replayed
    mixed = grid({2: [0.08, 0.02, 0.01]}) + [run(100, 6, 1e-3, 0, 0.05)]
    assert [dict(r.point)["p"] for r in replay(mixed)] == ["2"]
    [path] = write_halving(spec, mixed, tmp_path)
    text = path.read_text()
    assert "| p=2 |" in text and "| p=6 |" not in text
    pruning = SimpleNamespace(pruner="halving", direction="maximize", metric="val/acc")
    assert write_halving(pruning, mixed, tmp_path / "x") == []


def test_the_replay_follows_the_curve_of_the_studys_objective():
    """In a study judged by zoology's metric each run's example_curve is replayed, not its
    val/acc curve: here the two metrics rank the lrs in opposite orders, and a run that
    recorded no example_curve (from before it was recorded) is left out."""
    trials = grid({2: [0.08, 0.02, 0.01]})  # val/acc: 3e-4 best
    for t in trials:  # zoology's metric: the reverse
        rate = {3e-4: 0.01, 1e-3: 0.02, 3e-3: 0.08}[t.params["model.lr"]]
        t.user_attrs["example_curve"] = [[s, min(1.0, rate * (i + 1))]
                                         for i, s in enumerate(STEPS)]
        t.value = max(v for _, v in t.user_attrs["example_curve"])
    args = {"min_resource": 500, "reduction_factor": 3}
    [by_acc] = replay(trials, args=args)
    [by_example] = replay(trials, args=args, metric="val/example_acc")
    # replayed on the val/acc curves (what the replay read before), the lrs that are best by
    # the study's values are stopped, and halving misses its best lr
    assert by_acc.best_halving == 3e-4 != by_acc.best_full and (3e-3, 0) in by_acc.pruned
    # by zoology's metric every later lr is better than the ones before it: none is stopped
    assert by_example.best_full == by_example.best_halving == 3e-3 and by_example.pruned == {}
    del trials[0].user_attrs["example_curve"]
    [fewer] = replay(trials, args=args, metric="val/example_acc")
    assert fewer.steps_full == 5 * 3000


def test_a_tie_at_every_lr_keeps_the_full_grids_best_lr():
    # every lr reaches 100 %, nothing is stopped: halving's best lr is the full grid's (the
    # tie's middle lr), not whichever lr comes first
    trials = grid({2: [0.5, 0.5, 0.5]})
    [point] = replay(trials, args={"min_resource": 1500, "reduction_factor": 3})
    assert point.pruned == {}
    assert point.best_full == point.best_halving == 1e-3


def test_a_widened_lr_runs_whole_in_the_replay_as_the_live_pruner_runs_it(tmp_path):
    from types import SimpleNamespace

    import optuna
    from optuna.distributions import FloatDistribution, IntDistribution

    from sweeps.halving import write_halving
    from sweeps.pruning import BracketPruner

    # the grid's 3e-4 is best of its lrs; 9e-5, added by --widen after them, starts slowest
    # and ends best: the live pruner never stops it, so neither may the replay
    trials = grid({2: [0.08, 0.02, 0.01]})
    late = [0.01] * 8 + [0.5, 0.9, 1.0, 1.0]
    trials += [curve_run(len(trials) + seed, 9e-5, seed, late) for seed in (0, 1)]
    args = {"min_resource": 1500, "reduction_factor": 3}
    lrs = [3e-4, 1e-3, 3e-3]
    spec = SimpleNamespace(pruner="none", direction="maximize", metric="val/acc", lr=lrs)
    [path] = write_halving(spec, trials, tmp_path)  # the spec's lrs tell the widened ones
    assert "| p=2 | 9e-05 | 9e-05 | yes |" in path.read_text()
    [point] = replay(trials, args=args, grid_lrs=lrs)
    assert not any(lr == 9e-5 for lr, _ in point.pruned)
    assert point.best_full == point.best_halving == 9e-5
    # the same curves fed live, in trial order, to the sweep's pruner: the same runs stop
    live = optuna.create_study(direction="maximize", pruner=BracketPruner(
        optuna.pruners.SuccessiveHalvingPruner(**args), grid_lrs=lrs))
    stopped = {}
    for t in trials:
        lr, seed = t.params["model.lr"], t.params["seed_everything"]
        trial = live.ask({"p": IntDistribution(2, 2), "model.lr": FloatDistribution(lr, lr),
                          "seed_everything": IntDistribution(seed, seed)})
        for step, value in t.user_attrs["val_curve"]:
            trial.report(value, step)
            if trial.should_prune():
                stopped[(lr, seed)] = step
                break
        live.tell(trial, None if (lr, seed) in stopped else t.value,
                  state=optuna.trial.TrialState.PRUNED if (lr, seed) in stopped else None)
    assert stopped == point.pruned


def test_order_checks_of_more_than_five_lrs_do_not_all_run_the_lowest_lr_first():
    from sweeps.halving import MAX_ORDERS, order_checks

    # six lrs (720 orders, more than MAX_ORDERS): the lowest starts slowest and ends best, so
    # halving keeps it only when it reaches the rung first; the orders replayed must not all
    # be the lexicographically first ones, which all start with it
    lrs = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
    slow = [0.05] * 6 + [0.95] * 6
    fast = [0.5] * 2 + [0.8] * 10
    trials = [curve_run(i, lr, 0, slow if lr == 1e-4 else fast) for i, lr in enumerate(lrs)]
    [half] = order_checks(trials, "maximize", {"reduction_factor": 3}, fractions=(1 / 2,))
    assert len(half.kept) == MAX_ORDERS
    assert 0 in half.kept and 1 in half.kept
