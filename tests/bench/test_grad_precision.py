"""The bf16-against-fp32 gradient report: its arms, its identities and its one-line errors."""

import json

import pytest
import torch
from paths import config

from arbench.bench import grad_precision as gp

SMOKE_ARGS = ["--config", config("p2.yaml"), "--config", config("profiles/smoke.yaml"),
              "--config", config("sizes/tiny.yaml")]


@pytest.fixture(scope="module")
def tiny():
    model, data = gp.build([a for a in SMOKE_ARGS if a != "--config"], [], None)
    return model, gp.training_batches(data, 2)


def test_one_batch_equals_mean_of_one(tiny):
    model, batches = tiny
    [row, *_] = gp.compare(model, batches[:1])
    assert row["one_batch"] == pytest.approx(row["mean_of_k"], rel=1e-12)


def test_arms_and_restored_switches(tiny):
    model, batches = tiny
    rows = gp.compare(model, batches)
    subsets = ["conv in fp32", "linear in fp32", "every mixer in fp32",
               "feature maps in fp32", "conv + feature maps in fp32",
               "attention projections in fp32", "conv + attention projections in fp32",
               "state products in fp32", "conv + state products in fp32",
               "feature maps + state products in fp32",
               "conv + feature maps + state products in fp32"]
    assert [r["arm"] for r in rows] == ["bf16-mixed", *subsets, "head in fp32",
                                        *(f"{a} + head in fp32" for a in subsets)]
    assert all(0 < r["one_batch"] < 1 and 0 < r["mean_of_k"] < 1 for r in rows[:15])
    # nothing left in bf16: the embedding, norms and residual adds run in fp32 under autocast
    every = rows[15]
    assert every["arm"] == "every mixer in fp32 + head in fp32"
    assert every["one_batch"] == every["mean_of_k"] == 0.0
    assert all(0 < r["one_batch"] for r in rows[16:])
    assert [b.fp32_mixer for b in model.blocks] == [False, False]  # put back after each arm
    assert not any({"forward", "mix"} & set(vars(m)) for m in model.modules())
    # fp32 reference: no autocast, the same gradient twice
    x, y = batches[0]
    a, b = (gp.loss_gradient(model, x, y, bf16=False) for _ in range(2))
    assert gp.relative_error(a, b) == 0.0


def test_kept_layers_really_run_in_fp32(tiny):
    model, batches = tiny
    x, y = batches[0]
    seen = []
    hook = model.blocks[0].mixer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    with gp.kept_in_fp32(model, ["conv"]):
        gp.loss_gradient(model, x, y, bf16=True)
    gp.loss_gradient(model, x, y, bf16=True)
    hook.remove()
    assert seen == [torch.float32, torch.bfloat16]
    out = []
    attention = model.blocks[1].mixer
    hooks = [m.register_forward_hook(lambda _m, _i, o: out.append(o.dtype))
             for m in (attention.qkv, attention.phi_q, model.head)]
    mixed = []
    mix = type(attention).mix

    def spy(self, *args):
        y = mix(self, *args)
        mixed.append((args[1].dtype, y.dtype))
        return y

    type(attention).mix = spy
    try:
        with gp.kept_in_fp32(model, [], ("head", "feature maps", "attention projections")):
            gp.loss_gradient(model, x, y, bf16=True)
        with gp.kept_in_fp32(model, [], ("state products",)):
            gp.loss_gradient(model, x, y, bf16=True)
    finally:
        type(attention).mix = mix
        for h in hooks:
            h.remove()
    assert out == [torch.float32] * 3 + [torch.bfloat16] * 3
    # the state products alone: features from a bf16 map, multiplied in fp32
    assert mixed[-1] == (torch.float32, torch.float32)


def test_main_writes_the_report(tmp_path, capsys):
    assert gp.main([*SMOKE_ARGS, "--batches", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "grad_precision.json").read_text())["rows"]
    assert len(rows) == 24 and rows[0]["worst"][0]["param"]
    assert rows[12]["fp32_parts"] == ["head"] and rows[4]["fp32_parts"] == ["feature maps"]
    md = (tmp_path / "grad_precision.md").read_text()
    assert "| conv in fp32 |" in md and "K = 2 training batches" in md


@pytest.mark.parametrize("extra, message", [
    (["--set", "model.lr"], "--set 'model.lr': expected key=value"),
    (["--ckpt", "missing.ckpt"], "--ckpt missing.ckpt"),
    (["--batches", "0"], "--batches must be >= 1"),
])
def test_bad_input_is_one_line(tmp_path, capsys, extra, message):
    assert gp.main([*SMOKE_ARGS, *extra, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]


def test_checkpoint_of_another_model_is_refused(tmp_path, capsys):
    ckpt = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"model.embed.weight": torch.zeros(3, 3)}}, ckpt)
    assert gp.main([*SMOKE_ARGS, "--ckpt", str(ckpt), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: --ckpt {ckpt} does not fit this model: size mismatch for ")
    # the reason names the keys and shapes, not only "Error(s) in loading state_dict"
    assert "size mismatch for embed.weight: checkpoint torch.Size([3, 3]), model" in err
    assert "missing key(s) " in err


def test_checkpoint_trained_with_other_settings_names_them(tmp_path, capsys):
    """As main.py validate: the saved hyperparameters that differ from the config, one line."""
    ckpt = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"model.embed.weight": torch.zeros(3, 3)},
                "hyper_parameters": {"d_model": 99, "n_layers": 7, "lr": 1.0}}, ckpt)
    assert gp.main([*SMOKE_ARGS, "--ckpt", str(ckpt), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: checkpoint {ckpt} was trained with model.d_model=99 "
                              "(the config has 32); model.n_layers=7 (the config has 2): ")
    assert not (tmp_path / "o").exists()
