import pytest
import torch
from approx_helpers import gaussian_qk

from arbench.approx import study as study_module
from arbench.approx.fit import FitConfig
from arbench.approx.polish import PolishConfig
from arbench.approx.starts import StartConfig
from arbench.approx.study import (
    FITTED_OPTIMAL,
    FLOOR,
    Split,
    StudyConfig,
    floor_records,
    pair_scale,
    split_pairs,
)
from arbench.approx.synthetic import synthetic_qk


@pytest.mark.parametrize("p", [2, 3])
def test_data_limit_equals_the_floor_when_train_and_held_out_coincide(p):
    q, k = gaussian_qk(50, 4, seed=p)
    same = Split(q, k, q, k, scale=1.0)
    records = {r.method: r for r in floor_records(same, p, 0, 0, StudyConfig(m=6))}
    limit, floor = records[FITTED_OPTIMAL], records[FLOOR]
    assert floor.rel_frobenius > 1e-3  # rank 6 is not exact here
    assert limit.rel_frobenius == pytest.approx(floor.rel_frobenius, rel=1e-6)
    assert limit.rmae == pytest.approx(floor.rmae, rel=1e-6)


def test_data_limit_on_other_training_pairs_is_above_the_floor():
    q, k = gaussian_qk(90, 4, seed=1)
    split = Split(q[:40], k[:40], q[40:], k[40:], scale=1.0)
    records = {r.method: r for r in floor_records(split, 3, 0, 0, StudyConfig(m=6))}
    assert records[FITTED_OPTIMAL].rel_frobenius > records[FLOOR].rel_frobenius


def test_training_only_sequences_add_training_tokens_and_keep_the_held_out_pairs():
    base = synthetic_qk([0], head_dim=4, num_seqs=6, seq_len=16, seed=3)
    more = synthetic_qk([0], head_dim=4, num_seqs=6, seq_len=16, seed=3, train_seqs=4)
    assert more.train_only == 4 and more.q.shape[2] == 10
    # synthetic_qk draws all sequences at once (its base ones differ): pair base with extras
    q = torch.cat([base.q[0, 0], more.q[0, 0, 6:]])
    k = torch.cat([base.k[0, 0], more.k[0, 0, 6:]])
    config = StudyConfig(n_train=100, n_test=40)
    old = split_pairs(base.q[0, 0], base.k[0, 0], config)
    new = split_pairs(q, k, config, train_only=4)
    assert old.q_train.shape[0] == 48 and new.q_train.shape[0] == 100  # 3 x 16, then n_train
    ratio = (new.scale / old.scale) ** 0.5  # both are divided by their own √c
    torch.testing.assert_close(new.q_test * ratio, old.q_test)
    torch.testing.assert_close(new.k_test * ratio, old.k_test)
    torch.testing.assert_close(new.q_train[:48] * ratio, old.q_train)
    extra = (q[6:] / new.scale ** 0.5).reshape(-1, 4)
    assert all(bool((extra == row).all(dim=1).any()) for row in new.q_train[48:])


def test_split_needs_two_sequences_besides_the_training_only_ones():
    q = torch.randn(5, 8, 3)
    with pytest.raises(ValueError, match="at least 2 sequences besides"):
        split_pairs(q, q, StudyConfig(), train_only=4)


def test_pair_scale_is_the_rms_of_all_dot_products():
    q, k = gaussian_qk(30, 5, seed=4)
    direct = float((q.double() @ k.double().T).pow(2).mean().sqrt())
    assert pair_scale(q, k) == pytest.approx(direct, rel=1e-12)


def test_validation_sequences_are_held_back_whole_and_change_nothing_else():
    qk = synthetic_qk([0], head_dim=4, num_seqs=6, seq_len=16, seed=3, train_seqs=5)
    q, k = qk.q[0, 0], qk.k[0, 0]
    plain = split_pairs(q, k, StudyConfig(n_train=200, n_test=40), train_only=5)
    split = split_pairs(q, k, StudyConfig(n_train=200, n_test=40, val_seqs=2), train_only=5)
    assert plain.q_val is None and split.q_val.shape == (2 * 16, 4)
    root = split.scale ** 0.5
    torch.testing.assert_close(split.q_val * root, q[9:].reshape(-1, 4))  # the last 2, whole
    torch.testing.assert_close(split.k_val * root, k[9:].reshape(-1, 4))
    train = split.q_train * root
    val_rows = q[9:].reshape(-1, 4)
    assert not any(bool((val_rows == row).all(dim=1).any()) for row in train)
    # 3 x 16 split tokens, then the 3 remaining training-only sequences' 48: 96 < n_train
    assert train.shape[0] == 96 and plain.q_train.shape[0] == 48 + 80
    ratio = (split.scale / plain.scale) ** 0.5
    torch.testing.assert_close(split.q_test * ratio, plain.q_test)  # held-out pairs unchanged


def test_more_validation_sequences_than_training_only_ones_is_one_line():
    q = torch.randn(8, 8, 3)
    with pytest.raises(ValueError, match="--val-seqs 3 needs as many training-only sequences"):
        split_pairs(q, q, StudyConfig(val_seqs=3), train_only=2)


def test_progress_lines_change_no_number_and_wait_for_their_interval(monkeypatch):
    """With --log-every 0 a fit prints its latest step / sweep line once the interval has
    passed (here 0 s: every line); the records are those of a quiet run, bit for bit, and at
    the default interval a short fit prints no progress line at all."""
    qk = synthetic_qk([0], head_dim=4, num_seqs=4, seq_len=16, seed=3)
    config = StudyConfig(ps=(2,), m=6, ranks=(1,), n_train=64, n_test=32,
                         methods=("llops", "flatten"), fit=FitConfig(
                             steps=12, check_every=4, batch=32, start=StartConfig(sweeps=3),
                             polish=PolishConfig(steps=3)))

    def records(interval: float) -> tuple[list, list[str]]:
        monkeypatch.setattr(study_module, "PROGRESS_SECONDS", interval)
        lines: list[str] = []
        return study_module.run_study(qk, config, lines.append), lines

    quiet, quiet_lines = records(60.0)
    loud, loud_lines = records(0.0)
    assert [(r.method, r.rmae, r.rel_frobenius, r.fit_steps) for r in loud] == \
        [(r.method, r.rmae, r.rel_frobenius, r.fit_steps) for r in quiet]
    assert not any("into the fit" in line for line in quiet_lines)
    progress = [line for line in loud_lines if line.endswith(" s into the fit)")]
    assert any(": ALS sweep 1 loss " in line for line in progress)
    assert any("Flatten: step 4/12 loss " in line for line in progress)
    def untimed(lines: list[str]) -> list[str]:
        return [line.rsplit(", ", 1)[0] for line in lines]  # the fit's seconds differ

    assert untimed([line for line in loud_lines if line not in progress]) == untimed(quiet_lines)
