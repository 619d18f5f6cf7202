import pytest
import torch
from approx_helpers import fake_lit, tiny_model

from arbench.approx.extract import (
    check_softmax_teacher,
    extract_from_teacher,
    extract_qk,
    load_teacher,
    softmax_layers,
)
from arbench.approx.qkset import load_qk, save_qk
from arbench.data.mqar import generate_mqar


def reference_qk(model, inputs, layer):
    """q, k of ``layer`` recomputed by running the blocks by hand: (b, h, n, head_dim)."""
    with torch.no_grad():
        x = model.embed(inputs)
        for i, block in enumerate(model.blocks):
            if i == layer:
                q, k, _ = block.mixer.qkv_heads(block.norm(x))
                return q, k
            x = block(x)
    raise AssertionError("layer not reached")


def test_extraction_shapes_and_values_match_qkv_heads():
    model = tiny_model(["softmax"], n_layers=3, num_heads=2)
    inputs, _ = generate_mqar(5, 16, 2, vocab_size=64, seed=1)
    q, k = extract_qk(model, inputs, layers=[0, 2], heads=[1], batch_size=2)
    assert q.shape == k.shape == (2, 1, 5, 16, 8)  # (layers, heads, seqs, n, head_dim)
    for i, layer in enumerate([0, 2]):
        ref_q, ref_k = reference_qk(model, inputs, layer)
        torch.testing.assert_close(q[i, 0], ref_q[:, 1])
        torch.testing.assert_close(k[i, 0], ref_k[:, 1])
    assert not any(b.mixer._forward_pre_hooks for b in model.blocks)  # hooks removed


def test_extract_from_teacher_metadata_and_file_roundtrip(tmp_path):
    model = tiny_model(["conv", "softmax"], n_layers=4, num_heads=2)
    assert softmax_layers(model) == [1, 3]
    qk = extract_from_teacher(model, [1, 3], [0, 1], num_seqs=3, seq_len=16, num_kv_pairs=2,
                              checkpoint="teacher.ckpt")
    assert qk.q.shape == (2, 2, 3, 16, 8)
    assert qk.meta["checkpoint"] == "teacher.ckpt" and qk.meta["layers"] == [1, 3]
    assert qk.meta["config"]["mixers"] == ["conv", "softmax", "conv", "softmax"]
    back = load_qk(save_qk(qk, tmp_path / "qk.pt"))
    torch.testing.assert_close(back.q, qk.q)
    assert back.meta == qk.meta
    sub = back.select([3], [1])
    torch.testing.assert_close(sub.q[0, 0], qk.get(3, 1)[0])
    with pytest.raises(ValueError, match="layer 2 is not in the saved extraction"):
        back.select([2])


def test_training_only_sequences_follow_the_held_out_ones_unchanged(tmp_path):
    model = tiny_model(["softmax"], n_layers=2, num_heads=1)
    args = dict(num_seqs=3, seq_len=16, num_kv_pairs=2)
    plain = extract_from_teacher(model, [0], [0], **args)
    more = extract_from_teacher(model, [0], [0], **args, train_seqs=2, train_seed=5)
    assert more.q.shape[2] == 5 and more.train_only == 2
    torch.testing.assert_close(more.q[:, :, :3], plain.q)  # the first num_seqs do not change
    assert more.meta["data"]["train_seqs"] == 2 and more.meta["data"]["train_seed"] == 5
    back = load_qk(save_qk(more, tmp_path / "qk.pt"))
    assert back.train_only == 2 and back.select([0], [0]).train_only == 2


def test_bad_layers_heads_and_models():
    model = tiny_model(["conv", "softmax"], n_layers=2, num_heads=2)
    with pytest.raises(ValueError, match="layer index 5 is out of range: the model has 2 layers"):
        extract_from_teacher(model, [5], [0])
    with pytest.raises(ValueError, match="layer 0 is a 'conv' layer, not softmax attention"):
        extract_from_teacher(model, [0], [0])
    with pytest.raises(ValueError, match="head index 2 is out of range"):
        extract_from_teacher(model, [1], [2])
    linear = tiny_model(["conv", "linear"], n_layers=2)
    with pytest.raises(ValueError, match="not a softmax teacher: its mixers are"):
        check_softmax_teacher(linear)


def test_load_teacher(tmp_path, monkeypatch):
    good, bad = tmp_path / "good.ckpt", tmp_path / "bad.ckpt"
    for path in (good, bad):  # checkpoints of plain tensors, read before the (fake) Lightning
        torch.save({"state_dict": {}}, path)
    teacher = tiny_model(["softmax"], n_layers=2)
    fake_lit(monkeypatch, {str(good): teacher, str(bad): tiny_model(["conv", "linear"])})
    assert load_teacher(good) is teacher
    with pytest.raises(ValueError, match="bad.ckpt is not a softmax teacher"):
        load_teacher(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_teacher(tmp_path / "missing.ckpt")
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(ValueError, match="cannot load .* as a LitRecall checkpoint"):
        load_teacher(other)
    (tmp_path / "empty.ckpt").touch()
    with pytest.raises(ValueError, match="--teacher .*empty.ckpt is not a readable checkpoint"):
        load_teacher(tmp_path / "empty.ckpt")


def test_load_qk_rejects_other_files(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"q": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not an arbench query/key extraction"):
        load_qk(path)
