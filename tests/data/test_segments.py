import pytest
import torch

from arbench.data import IGNORE_INDEX, Segment, SegmentBatches, generate_segments
from arbench.data.segments import check_segment, segment_seed
from arbench.data.tasks import TASKS


def test_segments_keep_slice_identity_and_seeds():
    segs = [Segment(32, 4, 10), Segment(64, 8, 7)]
    data = generate_segments(segs, vocab_size=256, seed=0, split="test")
    assert data[0].inputs.shape == (10, 32) and data[1].inputs.shape == (7, 64)
    same = generate_segments(segs, vocab_size=256, seed=0, split="test")
    assert torch.equal(data[1].labels, same[1].labels)
    other_split = generate_segments(segs, vocab_size=256, seed=0, split="train")
    assert not torch.equal(data[0].inputs, other_split[0].inputs)
    ds = SegmentBatches(data, batch_size=4, shuffle_seed=1)
    assert ds.slice_names == ["L32_N4", "L64_N8"]
    assert len(ds) == 3 + 2
    seen = {0: 0, 1: 0}
    for i in range(len(ds)):
        x, y, s = ds[i]
        assert x.shape[1] == segs[int(s)].seq_len
        seen[int(s)] += x.shape[0]
    assert seen == {0: 10, 1: 7}


def test_mqar_segment_settings_are_those_of_before_tasks():
    """The data module's cache key hashes these: plain MQAR keeps its cached data."""
    assert Segment(64, 8, 100).settings() == {"seq_len": 64, "num_kv_pairs": 8,
                                              "num_examples": 100}
    assert Segment(64, 8, 100, task="overwrite", num_updates=2).settings()["task"] == "overwrite"


TASK_SEGMENTS = [
    (Segment(32, 4, 6), "L32_N4"),
    (Segment(32, 4, 6, task="overwrite", num_updates=2), "ow_L32_N4_U2"),
    (Segment(32, num_examples=6, task="noisy_recall", noise_fraction=0.2, noise_vocab_size=8),
     "noisy_L32_F0.2_NV8"),
    (Segment(32, num_examples=6, task="fuzzy_recall", max_key_len=3, max_value_len=2),
     "fuzzy_L32_K3_V2"),
    (Segment(32, num_examples=6, task="selective_copying", num_tokens_to_copy=4), "copy_L32_T4"),
]


def test_each_task_generates_its_segment_and_names_its_slice():
    segs = [seg for seg, _ in TASK_SEGMENTS]
    data = generate_segments(segs, vocab_size=64, seed=2, split="test")
    assert [d.segment.name for d in data] == [name for _, name in TASK_SEGMENTS]
    for i, (seg, d) in enumerate(zip(segs, data)):
        assert d.inputs.shape == d.labels.shape == (6, 32)
        assert (d.labels != IGNORE_INDEX).any(dim=1).all()
        task = TASKS[seg.task]
        args = {k: getattr(seg, k) for k in task.settings}
        direct = task.generate(num_examples=6, seq_len=32, vocab_size=64,
                               seed=segment_seed(2, "test", i), **args)
        assert torch.equal(direct[0], d.inputs) and torch.equal(direct[1], d.labels)
    copy = data[-1]  # the data module's power_a and random_non_queries reach only gap tasks
    again = generate_segments(segs, vocab_size=64, seed=2, split="test", power_a=0.5,
                              random_non_queries=False)
    assert torch.equal(again[-1].inputs, copy.inputs)
    assert not torch.equal(again[1].inputs, data[1].inputs)


@pytest.mark.parametrize("seg,match", [
    (Segment(32, 4, 6, task="nope"), "task must be one of .*got 'nope'"),
    (Segment(32, 4, 6, num_updates=1), r"num_updates does not apply to task mqar \(it takes "
                                       r"num_kv_pairs\)$"),
    (Segment(32, 4, 6, task="overwrite"), "task overwrite needs num_updates"),
    (Segment(32, 4, 6, task="noisy_recall", noise_fraction=0.2, noise_vocab_size=8),
     "num_kv_pairs does not apply to task noisy_recall"),
    (Segment(32, num_examples=6), "task mqar needs num_kv_pairs"),
    (Segment(32, 4), "num_examples must be an integer >= 1, got None"),
    (Segment(32, num_examples=6, task="selective_copying", num_tokens_to_copy=16),
     "seq_len=32 is too short for num_tokens_to_copy=16"),
])
def test_check_segment_errors(seg, match):
    with pytest.raises(ValueError, match=match):
        check_segment(seg, vocab_size=64, power_a=0.01)
