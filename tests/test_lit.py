import functools

import lightning as L
import pytest
import torch

from arbench.data import Segment
from arbench.data.datamodule import MQARDataModule, ShardSampler
from arbench.featuremaps import LLoPS
from arbench.lit import DivergenceError, LitRecall


def tiny_data(**kw):
    return MQARDataModule(vocab_size=64, train_segments=[Segment(32, 4, 64)],
                          test_segments=[Segment(32, 4, 32), Segment(64, 8, 16)], batch_size=16,
                          eval_batch_size=8, **kw)


def tiny_model(**kw):
    return LitRecall(vocab_size=64, d_model=16, feature_map=functools.partial(LLoPS, m=8, p=2),
                     **kw)


def trainer(**kw):
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kw)


def test_nonfinite_loss_stops_with_step_and_quantity():
    model = tiny_model()
    with torch.no_grad():
        model.model.embed.weight[5:].fill_(float("nan"))
    with pytest.raises(DivergenceError, match=r"diverged at step 0: training loss is nan"):
        trainer(max_steps=3).fit(model, tiny_data())


def test_nonfinite_gradient_names_parameter():
    model = tiny_model()

    def poison(grad):
        return grad * float("inf")

    model.model.final_norm.weight.register_hook(poison)
    with pytest.raises(DivergenceError, match=r"gradient of model.final_norm.weight"):
        trainer(max_steps=3).fit(model, tiny_data())


def test_training_uses_the_fused_adamw_on_cpu():
    model, fit = tiny_model(), trainer(max_steps=2)
    fit.fit(model, tiny_data())
    (opt,) = fit.optimizers
    assert opt.defaults["fused"] is True
    assert [g["weight_decay"] for g in opt.param_groups] == [model.hparams.weight_decay, 0.0]


def test_feature_map_weight_decay_has_its_own_group():
    model, fit = tiny_model(feature_map_weight_decay=0.0), trainer(max_steps=2)
    theta_before = model.model.blocks[1].mixer.phi_q.theta.detach().clone()
    fit.fit(model, tiny_data())
    (opt,) = fit.optimizers
    decays = [g["weight_decay"] for g in opt.param_groups]
    assert decays == [model.hparams.weight_decay, 0.0, 0.0]
    thetas = {id(m.theta) for m in model.modules() if isinstance(m, LLoPS)}
    assert {id(p) for p in opt.param_groups[2]["params"]} == thetas  # φ_Q and φ_K: Θ alone
    assert not any(id(p) in thetas for g in opt.param_groups[:2] for p in g["params"])
    assert not torch.equal(model.model.blocks[1].mixer.phi_q.theta, theta_before)  # trained
    with pytest.raises(ValueError, match="feature_map_weight_decay"):
        tiny_model(feature_map_weight_decay=-1.0)


def test_validation_reports_overall_and_slice_accuracy():
    model, data = tiny_model(), tiny_data()
    out = trainer(max_steps=1).validate(model, data)[0]
    assert set(out) >= {"val/acc", "val/acc_L32_N4", "val/acc_L64_N8", "val/loss"}
    # micro accuracy: each answer counts once, so the overall value is the answer-weighted mean
    answers = {"L32_N4": 32 * 4, "L64_N8": 16 * 8}
    expected = sum(out[f"val/acc_{k}"] * n for k, n in answers.items()) / sum(answers.values())
    assert out["val/acc"] == pytest.approx(expected, abs=1e-6)


def test_shard_sampler_covers_every_item_once_for_eval():
    shards = [list(ShardSampler(11, r, 3, shuffle=False, seed=0, pad=False)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(11))
    train = [list(ShardSampler(11, r, 3, shuffle=True, seed=0, pad=True)) for r in range(3)]
    assert len({len(s) for s in train}) == 1 and set(sum(train, [])) == set(range(11))


def test_datamodule_cache_on_disk(tmp_path):
    a = tiny_data(cache_dir=str(tmp_path))
    a.setup("fit")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and all(f.startswith("mqar-") for f in files)
    b = tiny_data(cache_dir=str(tmp_path))
    b.setup("fit")
    assert torch.equal(a._train.data[0].inputs, b._train.data[0].inputs)


@pytest.mark.parametrize("kwargs,match", [
    ({"lr": -1.0}, "model.lr must be a positive number"),
    ({"min_lr_ratio": 2.0}, "min_lr_ratio"),
])
def test_bad_model_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_model(**kwargs)


def test_bad_data_args():
    with pytest.raises(ValueError, match=r"data.test_segments\[0\]: seq_len must be even"):
        MQARDataModule(vocab_size=64, test_segments=[Segment(33, 4, 8)])
    with pytest.raises(ValueError, match="data.batch_size must be an integer >= 1"):
        MQARDataModule(vocab_size=64, batch_size=0)


@pytest.mark.parametrize("hook", ["on_validation_epoch_start", "on_test_epoch_start"])
def test_accuracy_sums_stay_fp32_when_the_module_is_cast(hook):
    """Under ``bf16-true`` Lightning casts the module, metric states too; a bf16 running sum of
    512,000 answers at 80 % would read 1.0. The evaluation hooks put the sums back in fp32."""
    model = tiny_model().to(torch.bfloat16)
    assert model.val_acc.mean_value.dtype == torch.bfloat16  # what the cast does
    getattr(model, hook)()
    for _ in range(2000):
        model.val_acc.update(torch.full((256,), 0.8))
        model.example_acc.update(torch.full((256,), 0.8))
    assert model.val_acc.compute().item() == pytest.approx(0.8, abs=1e-4)
    assert model.example_acc.compute().item() == pytest.approx(0.8, abs=1e-4)
