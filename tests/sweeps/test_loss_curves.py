"""Training-loss curves read back from a run's event files, and the plot that overlays them."""

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from sweeps.report.loss import LOSS_TAG, loss_curve, run_parts, smoothed_loss_curves
from sweeps.report.plots import write_plot
from sweeps.spec import SpecError, _check_plots


def log_losses(folder: Path, points: dict[int, float]) -> None:
    writer = SummaryWriter(str(folder))
    for step, value in points.items():
        writer.add_scalar(LOSS_TAG, value, step)
        writer.add_scalar("val/acc", 0.5, step)  # another tag, ignored
    writer.close()


def test_a_resumed_run_is_its_parts_merged_the_later_part_winning(tmp_path):
    run = tmp_path / "cfgp4_lr0.001_seed0"
    log_losses(run / "version_0", {0: 6.0, 25: 5.0, 50: 4.0, 75: 3.75})  # killed after 75
    log_losses(run / "version_1", {75: 3.5, 100: 3.0})  # resumed from the step-50 checkpoint
    log_losses(run / "version_2", {0: 9.0})  # a later attempt: not part of version_1's run
    assert [p.name for p in run_parts(run / "version_1")] == ["version_0", "version_1"]
    assert loss_curve(run / "version_1") == [(0, 6.0), (25, 5.0), (50, 4.0), (75, 3.5),
                                             (100, 3.0)]
    assert loss_curve(run / "version_0") == [(0, 6.0), (25, 5.0), (50, 4.0), (75, 3.75)]


def test_runs_without_a_loss_give_no_curve(tmp_path):
    assert loss_curve(None) == [] and loss_curve(tmp_path / "gone") == []
    writer = SummaryWriter(str(tmp_path / "version_0"))
    writer.add_scalar("val/acc", 0.5, 0)
    writer.close()
    assert loss_curve(tmp_path / "version_0") == []
    assert smoothed_loss_curves([None, str(tmp_path / "version_0")], 3) == []


def test_the_loss_plot_overlays_each_points_runs(tmp_path):
    dirs = []
    for seed in range(2):
        folder = tmp_path / f"seed{seed}" / "version_0"
        log_losses(folder, {step: 6.0 - step / 100 + seed for step in range(0, 500, 25)})
        dirs.append(str(folder))
    curves = smoothed_loss_curves(dirs, 2)
    assert curves[0][:2] == [(0, 6.0), (25, pytest.approx(5.875))]  # trailing means of 2
    row = {"hparams": {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1}, "best_lr": 1e-3,
           "n": 2, "curves": [], "log_dirs": dirs}
    path = write_plot([row], {"x": "step", "y": "train_loss"}, tmp_path)
    assert path.name == "loss_curves.png" and path.stat().st_size > 1000


def test_a_plot_against_step_takes_no_other_y():
    assert _check_plots([{"x": "step", "y": "train_loss"}, {"x": "step"}])
    with pytest.raises(SpecError, match="not y: L64_N8"):
        _check_plots([{"x": "step", "y": "L64_N8"}])


def test_a_recorded_curve_stands_in_for_missing_event_files(tmp_path):
    """A run trained on another machine keeps its curve in its record; the event files of a
    run without one are still read."""
    folder = tmp_path / "here" / "version_0"
    log_losses(folder, {0: 6.0, 25: 5.0})
    recorded = [[25, 4.0], [50, 2.0]]
    curves = smoothed_loss_curves([str(tmp_path / "gone"), str(folder), None], 1,
                                  [recorded, None, None])
    assert curves == [[(25, 4.0), (50, 2.0)], [(0, 6.0), (25, 5.0)]]
    row = {"hparams": {"feature_map": "Based"}, "best_lr": 1e-3, "n": 1, "curves": [],
           "log_dirs": [str(tmp_path / "gone")], "loss_curves": [recorded]}
    assert write_plot([row], {"x": "step", "y": "train_loss"}, tmp_path).stat().st_size > 1000
