"""The data cache is read tensors only (``arbench.data.datamodule.read_cache``): a cache file
that would run code when unpickled, or holds anything but the data, stops with one line."""

import hashlib
import json

import pytest
import torch
from hostile import WritesMarker
from test_errors import FAST, P4, one_error
from test_lit import tiny_data

from arbench.checks import CliError
from arbench.cli import run
from arbench.data.datamodule import MQARDataModule
from arbench.data.segments import Segment


def cached(tmp_path):
    """A datamodule set up once with its cache in ``tmp_path``: the cache files it wrote."""
    tiny_data(cache_dir=str(tmp_path)).setup("fit")
    files = sorted(tmp_path.glob("mqar-*.pt"))
    assert len(files) == 2
    return files


@pytest.mark.parametrize("content,needle", [
    ("hostile", "refused: it holds an object other than tensors"),
    ("strings", "does not hold 1 (inputs, labels) tensor pairs: delete it"),
    ("short", "does not hold 1 (inputs, labels) tensor pairs: delete it"),
])
def test_a_bad_cache_file_is_refused_in_one_line(tmp_path, content, needle):
    cache = tmp_path / "cache"
    cache.mkdir()
    train = [f for f in cached(cache) if "-train-" in f.name][0]
    marker = tmp_path / "MARKER"
    stored = {"hostile": [(torch.zeros(1), WritesMarker(marker))],
              "strings": [("inputs", "labels")], "short": []}[content]
    torch.save(stored, train)
    with pytest.raises(CliError) as err:
        tiny_data(cache_dir=str(cache)).setup("fit")
    assert str(err.value).startswith(f"data cache file {train}")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_main_stops_on_a_hostile_cache_file(in_tmp, capsys):
    args = ["fit", *P4, *FAST, "--data.cache_dir", str(in_tmp / "cache")]
    run(args)
    marker = in_tmp / "MARKER"
    for path in (in_tmp / "cache").glob("mqar-*.pt"):
        torch.save([(torch.zeros(1), WritesMarker(marker))], path)
    line = one_error(capsys, args)
    assert "refused: it holds an object other than tensors" in line
    assert not marker.exists()


def _key_before_versions(dm, segments, split):
    """The cache key as computed before tasks had generator versions."""
    args = dict(segments=[s.settings() for s in segments], vocab_size=dm.vocab_size,
                seed=dm.seed, split=split, power_a=dm.power_a,
                random_non_queries=dm.random_non_queries, version=1)
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]


def test_cache_keys_change_only_for_a_changed_generator():
    """MQAR and overwrite data cached earlier keep their keys; selective copying, whose layout
    changed (task version 2), gets a new one, so its old cache files are never read."""
    kept = [Segment(64, 8, 100), Segment(64, 4, 100, task="overwrite", num_updates=2)]
    changed = [Segment(32, num_examples=6, task="selective_copying", num_tokens_to_copy=4)]
    dm = MQARDataModule(vocab_size=64, train_segments=kept, test_segments=changed)
    assert dm.cache_key(kept, "train") == _key_before_versions(dm, kept, "train")
    assert dm.cache_key(changed, "test") != _key_before_versions(dm, changed, "test")
    assert dm.cache_key(changed, "test") == dm.cache_key(list(changed), "test")
