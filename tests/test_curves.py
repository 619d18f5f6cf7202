"""Convergence and collapse verdicts on synthetic curves."""

import math

from arbench.curves import block_means, collapse_step, is_converged, smoothed


def val(steps, accs):
    return list(zip(steps, accs))


def test_plateau_converges_and_a_climb_does_not():
    steps = [250, 500, 750, 1000]
    assert is_converged(val(steps, [0.3, 0.6, 0.80, 0.805])) is True  # +0.5 point
    assert is_converged(val(steps, [0.3, 0.6, 0.714, 0.761])) is False  # the lr=1e-3 p4 run
    assert is_converged(val(steps, [0.3, 0.6, 0.9, 0.7])) is True  # fell: not rising any more
    assert is_converged(val(steps, [0.2, 0.5, 0.7, 0.99])) is True  # the stopping threshold
    assert is_converged(val([1000], [0.5])) is False  # no validation before the last quarter
    assert is_converged([]) is None


def loss_curve(values):
    return [(i + 1, v) for i, v in enumerate(values)]


def test_collapse_after_halving_is_found_at_the_crossing_step():
    start, low = math.log(512), 3.0
    rise = [low + (5.6 - low) * i / 200 for i in range(200)]
    curve = loss_curve([start] * 50 + [start - (start - low) * i / 300 for i in range(300)]
                       + [low] * 100 + rise + [5.6] * 100)
    step = collapse_step(curve)
    assert step is not None and 450 < step <= 750
    # 5.6 = 0.897 × ln 512: the lr=1e-2 run; the smoothed loss crossed 85% there
    assert dict(smoothed(curve))[step] > 0.85 * start


def test_learning_little_or_a_spike_is_not_a_collapse():
    start = math.log(512)
    assert collapse_step(loss_curve([start] * 100 + [0.8 * start] * 500)) is None  # never halved
    learned = [start] * 50 + [1.0] * 500
    spiked = learned[:300] + [start] * 3 + learned[300:]  # three bad steps, smoothed away
    assert collapse_step(loss_curve(learned)) is None
    assert collapse_step(loss_curve(spiked)) is None
    assert collapse_step(loss_curve([start] * 10)) is None  # too short to judge


def test_smoothed_is_a_trailing_mean():
    assert smoothed([(1, 1.0), (2, 3.0), (3, 5.0)], window=2) == [(1, 1.0), (2, 2.0), (3, 4.0)]


def test_a_warm_start_is_judged_against_guessing_not_its_first_loss():
    start = math.log(512)
    noisy = [0.006] * 50 + [0.0005] * 200 + [0.006] * 200  # trained, then noise at the bottom
    assert collapse_step(loss_curve(noisy)) is not None  # against its own first loss: "collapse"
    assert collapse_step(loss_curve(noisy), chance=start) is None
    back = [0.006] * 50 + [0.0005] * 200 + [5.6] * 200  # back to guessing
    assert collapse_step(loss_curve(back), chance=start) is not None



def test_block_means_average_each_block_of_steps_at_its_last_step():
    losses = [(step, float(step)) for step in range(1, 61)]  # steps 1..60
    assert block_means(losses, 25) == [(25, 13.0), (50, 38.0), (60, 55.5)]
    assert block_means([(1, 2.0 / 3.0)], 25, digits=3) == [(1, 0.667)]
    assert block_means([]) == []


def test_one_validation_at_step_0_is_not_a_plateau():
    # a DDP run's pruning callback reports at the epoch number: one epoch gives step 0 only;
    # the last validation is no earlier validation to compare it with
    assert is_converged(val([0], [0.3])) is False
    assert is_converged(val([0, 0], [0.3, 0.305])) is True  # two at step 0: +0.5 point


def test_a_nan_validation_does_not_hide_the_threshold():
    nan = float("nan")
    assert is_converged(val([250, 500], [0.995, nan])) is True
    assert is_converged(val([250, 500], [nan, 0.995])) is True  # max() kept the first NaN
