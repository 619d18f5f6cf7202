"""zoology's recipe (configs/recipes/zoology.yaml): each switch does what it says, and the
per-example metric matches a hand computation."""

import functools
import json
import math

import lightning as L
import pytest
import torch
from paths import SMOKE, config

from arbench.cli import run
from arbench.data import Segment
from arbench.data.datamodule import MQARDataModule
from arbench.featuremaps import LLoPS
from arbench.lit import LitRecall
from arbench.metrics import example_accuracy
from arbench.objective import summary_value
from arbench.schedule import lr_factor


def tiny_model(**kw):
    return LitRecall(vocab_size=64, d_model=16, feature_map=functools.partial(LLoPS, m=8, p=2),
                     **kw)


def tiny_data(**kw):
    return MQARDataModule(vocab_size=64, train_segments=[Segment(32, 4, 40), Segment(64, 8, 24)],
                          test_segments=[Segment(32, 4, 32)], batch_size=16, eval_batch_size=8,
                          **kw)


def test_example_accuracy_by_hand():
    # example 0: 2 of 4 right; example 1: no answer; example 2: 1 of 1
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    rows = torch.tensor([0, 0, 0, 0, 2])
    assert example_accuracy(correct, rows, 3).tolist() == [0.5, 1.0]


def test_example_metric_weighs_slices_equally():
    """Two slices of one example each: 4 of 4 answers right on the short one, 3 of 12 on the
    long one. Per answer token 7/16; per example (zoology) (1 + 0.25) / 2."""
    lit = tiny_model()
    lit.slice_names = ["short", "long"]
    lit.slice_acc = torch.nn.ModuleList([type(lit.val_acc)(), type(lit.val_acc)()])
    lit.slice_example_acc = torch.nn.ModuleList([type(lit.val_acc)(), type(lit.val_acc)()])
    vocab = 64

    def fake(right: int, total: int):
        targets = torch.arange(total) % vocab
        logits = torch.zeros(total, vocab)
        wrong = (targets + 1) % vocab
        logits[torch.arange(total), torch.where(torch.arange(total) < right, targets, wrong)] = 1
        return logits, targets, torch.zeros(total, dtype=torch.long)

    logged = {}
    lit.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    for index, (right, total) in enumerate([(4, 4), (3, 12)]):
        lit.model.answer_logits = lambda inputs, labels, r=right, n=total: fake(r, n)
        lit._eval_step((torch.zeros(1, 8, dtype=torch.long), None, torch.tensor(index)), "val")
    lit._eval_epoch_end("val")
    assert logged["val/acc"] == pytest.approx(7 / 16)
    assert logged["val/example_acc"] == pytest.approx(0.625)
    assert logged["val/example_acc_long"] == pytest.approx(0.25)
    assert logged["val/acc_short"] == pytest.approx(1.0)


def test_embedding_dropout_only_in_training():
    torch.manual_seed(0)
    lit = tiny_model(embedding_dropout=0.5)
    plain = tiny_model()
    plain.load_state_dict(lit.state_dict())
    x = torch.randint(0, 64, (2, 16))
    lit.eval(), plain.eval()
    assert torch.equal(lit(x), plain(x))
    lit.train()
    assert not torch.allclose(lit(x), plain.eval()(x))
    assert tiny_model().model.embed_dropout is None  # off by default: no RNG drawn


@pytest.mark.parametrize("bad", [1.0, -0.1])
def test_embedding_dropout_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="embedding_dropout must be a number in"):
        tiny_model(embedding_dropout=bad)


def fitted(max_steps: int = 2, data=None, **kw) -> tuple[LitRecall, L.Trainer]:
    lit = tiny_model(**kw)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        max_steps=max_steps, limit_val_batches=0)
    trainer.fit(lit, data or tiny_data())
    return lit, trainer


def test_betas_and_decay_scope():
    _, default = fitted()
    (opt,) = default.optimizers
    assert opt.defaults["betas"] == (0.9, 0.98)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    lit, zoo = fitted(betas=(0.9, 0.999), weight_decay_scope="all")
    (opt,) = zoo.optimizers
    assert opt.defaults["betas"] == (0.9, 0.999)
    decayed = [p for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]]
    assert {id(p) for p in decayed} == {id(p) for p in lit.parameters()}
    assert any(p.dim() < 2 for p in decayed)  # norms and biases too


def test_zoology_schedule_values():
    # 32 epochs of 10 steps: constant within an epoch, cosine over epochs, no warm-up
    f = [lr_factor("zoology", s, 320, warmup_steps=50, steps_per_epoch=10) for s in range(320)]
    assert f[0] == f[9] == 1.0
    assert f[10] == pytest.approx(0.5 * (1 + math.cos(math.pi / 32)))
    assert f[319] == pytest.approx(0.5 * (1 + math.cos(math.pi * 31 / 32)))
    assert f[319] == pytest.approx(0.0024, abs=1e-4)
    assert len(set(f)) == 32
    # the default: warm-up to 1 at its last step, then per-step cosine that reaches
    # min_lr_ratio at the last step taken (99 of 0..99), the peak not repeated
    cos = [lr_factor("cosine", s, 100, warmup_steps=10, min_lr_ratio=0.2) for s in range(100)]
    assert cos[0] == pytest.approx(0.1) and cos[9] == 1.0 > cos[10]
    assert cos[10] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 90)))
    assert cos[99] == pytest.approx(0.2) and min(cos[10:]) == pytest.approx(0.2)


def test_zoology_schedule_steps_once_per_epoch_in_training():
    # 4 batches an epoch (40/16 -> 3, 24/16 -> 2: 5), 12 steps: 3 epochs
    lit, trainer = fitted(max_steps=12, lr_schedule="zoology", lr=1e-2)
    assert trainer.num_training_batches == 5
    (opt,) = trainer.optimizers
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 2 / 3)))


def test_unshuffled_order_is_segment_by_segment():
    dm = tiny_data(shuffle=False)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [int(b[2]) for b in batches] == [0, 0, 0, 1, 1]
    first = torch.cat([b[0] for b in batches[:3]])
    assert torch.equal(first, dm._train.data[0].inputs)  # generation order
    again = [b[0] for b in dm.train_dataloader()]  # every epoch the same
    assert all(torch.equal(a, b[0]) for a, b in zip(again, batches))
    shuffled = tiny_data()
    shuffled.setup("fit")
    assert [int(b[2]) for b in shuffled.train_dataloader()] != [0, 0, 0, 1, 1]


def test_zoology_recipe_trains_at_smoke_size(in_tmp):
    cli = run(["fit", "--config", config("p4.yaml"), *SMOKE,
               "--config", config("recipes/zoology.yaml"), "--trainer.max_steps", "10",
               "--trainer.enable_progress_bar", "false"])
    hp = cli.model.hparams
    assert (hp.embedding_dropout, tuple(hp.betas), hp.weight_decay_scope, hp.lr_schedule) == (
        0.1, (0.9, 0.999), "all", "zoology")
    assert cli.datamodule.shuffle is False
    (summary,) = in_tmp.glob("runs/p4/version_0/summary.json")
    saved = json.loads(summary.read_text())
    assert 0 <= saved["example_acc"] <= 1 and set(saved["example_slices"]) == set(saved["slices"])
    assert summary_value(saved, "val/example_acc") == saved["example_acc"]
    assert summary_value(saved, "val/acc_L64_N8") == saved["slices"]["L64_N8"]
    assert saved["hparams"]["lr_schedule"] == "zoology" and saved["hparams"]["shuffle"] is False
    assert saved["hparams"]["precision"] == "32-true"


@pytest.mark.parametrize("flag,value,needle", [
    ("--model.weight_decay_scope", "norms", "weight_decay_scope must be one of"),
    ("--model.lr_schedule", "linear", "lr_schedule must be one of"),
    ("--model.betas", "[0.9, 1.5]", "betas must be two numbers in"),
])
def test_bad_recipe_values_one_line(in_tmp, capsys, flag, value, needle):
    with pytest.raises(SystemExit):
        run(["fit", "--config", config("p4.yaml"), *SMOKE, flag, value])
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err
