"""init_from: continued training from another run's checkpoint, BASED embedded into LLoPS."""

import pytest
import torch
from paths import SMOKE, config

from arbench.cli import run

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
AFFINE = ["--model.feature_map.init_args.affine", "true"]


@pytest.fixture(scope="module")
def based_ckpt(tmp_path_factory):
    """One BASED smoke run (10 steps) that every test starts from."""
    root = tmp_path_factory.mktemp("based")
    run(["fit", "--config", config("based.yaml"), *SMOKE, "--trainer.max_steps", "10",
         "--trainer.logger.init_args.save_dir", str(root / "runs"), *QUIET])
    return str(root / "runs/based/checkpoints/last.ckpt")


def validate(method: str, *args: str) -> float:
    cli = run(["validate", "--config", config(method), *SMOKE, *args, *QUIET])
    return float(cli.trainer.callback_metrics["val/acc"])


@pytest.mark.parametrize("method", ["p2.yaml", "p4.yaml"])
def test_embedded_llops_validates_like_the_based_checkpoint(based_ckpt, in_tmp, method):
    want = validate("based.yaml", "--ckpt_path", based_ckpt)
    got = validate(method, *AFFINE, "--model.init_from", based_ckpt)
    assert got == pytest.approx(want, abs=1e-6)


def test_fit_continues_from_based_with_a_fresh_optimizer(based_ckpt, in_tmp, capsys):
    cli = run(["fit", "--config", config("p2.yaml"), *SMOKE, *AFFINE,
               "--model.init_from", based_ckpt, "--model.init_spare_std", "0.01",
               "--trainer.max_steps", "4", *QUIET])
    assert cli.trainer.global_step == 4
    assert "embedded from BASED" in capsys.readouterr().out
    ckpt = torch.load(in_tmp / "runs/p2/checkpoints/last.ckpt", weights_only=False)
    assert ckpt["hyper_parameters"]["init_from"] == based_ckpt


@pytest.mark.parametrize("args,needle", [
    ([config("p4.yaml")], "needs an affine rank-1 LLoPS map"),
    ([config("p4.yaml"), *AFFINE, "--model.d_model", "64"], "another d_model"),
    ([config("p4.yaml"), *AFFINE, "--model.feature_map.init_args.m", "64"],
     "needs m >= 1 + r + r(r+1)/2 = 153"),
    ([config("flatten.yaml")], "no known conversion"),
])
def test_incompatible_checkpoint_one_line(based_ckpt, in_tmp, capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        run(["fit", "--config", args[0], *SMOKE, *args[1:], "--model.init_from",
             based_ckpt, "--trainer.max_steps", "2", *QUIET])
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and needle in err[0], err


def test_missing_checkpoint_one_line(in_tmp, capsys):
    with pytest.raises(SystemExit):
        run(["fit", "--config", config("based.yaml"), *SMOKE, "--model.init_from",
             "nope.ckpt", "--trainer.max_steps", "2", *QUIET])
    assert "error: init_from: no checkpoint at nope.ckpt" in capsys.readouterr().err


def test_init_from_in_a_sweep(based_ckpt, tmp_path):
    """A sweep passes init_from like any key: the trial starts from the BASED checkpoint."""
    import subprocess
    import sys

    import optuna
    import yaml

    spec = {"study": "warm", "configs": [config("p2.yaml")], "profile": "smoke", "size": "tiny",
            "lr": [3e-3],
            "grid": {"model.init_from": [based_ckpt], "seed_everything": [0]},
            "args": ["--trainer.max_steps=3", "--trainer.val_check_interval=3",
                     "--model.feature_map.init_args.affine=true"]}
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    subprocess.run([sys.executable, "-m", "sweeps", "run", str(path), "--storage", url,
                    "--runs", str(tmp_path / "runs")], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)
    (trial,) = optuna.load_study(study_name="warm", storage=url).get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["hparams"]["init_from"] == based_ckpt
