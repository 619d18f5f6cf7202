import torch

from arbench.data import Segment, SegmentBatches, generate_segments


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
