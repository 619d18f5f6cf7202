import json

import torch
from paths import SMOKE, config

from arbench.cli import run


def fit(max_steps: int, *extra: str) -> None:
    run(["fit", "--config", config("p4.yaml"), *SMOKE, "--trainer.max_steps",
         str(max_steps), "--trainer.val_check_interval", "3", "--trainer.enable_progress_bar",
         "false", *extra])


def summary(in_tmp, version: int) -> dict:
    return json.loads((in_tmp / f"runs/p4/version_{version}/summary.json").read_text())


def test_resumed_run_keeps_the_validations_before_the_kill(in_tmp):
    fit(6)
    first = summary(in_tmp, 0)
    assert first["val_acc"] is not None and first["best_step"] in (3.0, 6.0)
    # Killed after its last checkpoint, before its result was read: resuming at max_steps
    # trains nothing and validates nothing, and must still report the same result.
    fit(6, "--ckpt_path", "last")
    again = summary(in_tmp, 1)
    for key in ("val_acc", "last_val_acc", "best_step", "slices", "val_curve", "example_curve",
                "loss_curve"):
        assert again[key] == first[key], key
    assert [s for s, _ in first["example_curve"]] == [s for s, _ in first["val_curve"]] == [3, 6]
    assert max(v for _, v in first["example_curve"]) == first["example_acc"]
    assert again["finished"]
    fit(9, "--ckpt_path", "last")
    longer = summary(in_tmp, 2)
    assert longer["val_acc"] >= first["val_acc"] and longer["global_step"] == 9
    assert [s for s, _ in longer["example_curve"]] == [3, 6, 9]  # the curve survives the resume
    # the training loss: one block of the 25-step means, its first 6 steps from before the kill
    assert [s for s, _ in first["loss_curve"]] == [6] and [s for s, _ in longer["loss_curve"]] == [9]
    ckpt = torch.load(in_tmp / "runs/p4/checkpoints/last.ckpt", weights_only=True)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("RunSummary")]
    assert [s for s, _ in state["loss_curve"]] == list(range(1, 10))  # before and after the kill
    if longer["best_step"] != 9.0:
        assert longer["val_acc"] == first["val_acc"]


def test_the_collapse_verdict_knows_the_models_chance_loss():
    import functools
    import math

    from arbench.featuremaps import LLoPS
    from arbench.lit import LitRecall
    from arbench.summary import chance_loss

    model = LitRecall(vocab_size=64, d_model=16, feature_map=functools.partial(LLoPS, m=8, p=2))
    assert chance_loss(model) == math.log(64)


def test_the_device_is_the_one_trained_on_not_where_teardown_left_the_module(tmp_path, monkeypatch):
    # Lightning's teardown moves the module back to the CPU before on_fit_end, so a GPU run once
    # reported "cpu: <model>". The strategy's device is the one the run trained on.
    from types import SimpleNamespace

    import torch

    from arbench import summary as summary_mod

    monkeypatch.setattr(summary_mod, "device_name", lambda device: f"named {torch.device(device)}")
    trainer = SimpleNamespace(is_global_zero=True, callbacks=[], global_step=0,
                              strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    module = SimpleNamespace(device=torch.device("cpu"), hparams={})
    callback = summary_mod.RunSummary()
    callback.write(trainer, module, finished=True, log_dir=str(tmp_path))
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["device"] == "named cuda:0"


def test_the_loss_curve_has_one_point_per_step_with_gradient_accumulation(in_tmp):
    """Lightning hands each of k accumulated batches' losses divided by k: the curve keeps
    their mean once per optimiser step, on the loss's own scale (near ln 64 at the start)."""
    fit(8, "--trainer.accumulate_grad_batches", "4")
    ckpt = torch.load(in_tmp / "runs/p4/checkpoints/last.ckpt", weights_only=True)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("RunSummary")]
    steps = [s for s, _ in state["loss_curve"]]  # to the last checkpoint's step
    assert len(steps) >= 6 and steps == list(range(1, len(steps) + 1))
    assert all(3.0 < v < 5.0 for _, v in state["loss_curve"])  # not divided by 4


def test_validate_of_a_checkpoint_keeps_the_trainings_curves_and_verdict(in_tmp):
    # 6 steps validated once, at the end: no validation before 3/4 of the steps, so not
    # converged. A validate of the checkpoint must not add its evaluation (logged at step 0 of
    # the validate run) to the training's curve, which then read as a plateau: converged.
    fit(6, "--trainer.val_check_interval", "6")
    trained = summary(in_tmp, 0)
    assert trained["converged"] is False
    run(["validate", "--config", config("p4.yaml"), *SMOKE, "--trainer.enable_progress_bar",
         "false", "--ckpt_path", "runs/p4/checkpoints/last.ckpt"])
    evaluated = summary(in_tmp, 1)
    for key in ("val_curve", "example_curve", "loss_curve", "converged", "collapsed_at"):
        assert evaluated[key] == trained[key], key
    assert evaluated["last_val_acc"] == trained["last_val_acc"]  # the same model, the same data
