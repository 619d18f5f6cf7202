"""LightningDataModule: the train mixture and the test slices of MQAR or its variants (each
segment's ``task``), built from YAML."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from arbench.checks import CliError, check_int
from arbench.ckpt_check import load_tensors
from arbench.data.segments import (
    Segment,
    SegmentBatches,
    SegmentData,
    SegmentSpec,
    as_segment,
    check_segment,
    generate_segments,
)
from arbench.data.tasks import TASKS
from arbench.files import atomic_write


def read_cache(path: Path, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``count`` ``(inputs, labels)`` tensor pairs of a data cache file, loaded tensors
    only (:func:`arbench.ckpt_check.load_tensors`: a file that would run code is refused);
    anything else raises :class:`CliError` with one line saying to delete the file."""
    what = f"data cache file {path}"
    stored = load_tensors(path, what, kind="data cache file")
    if not (isinstance(stored, list) and len(stored) == count
            and all(isinstance(pair, (list, tuple)) and len(pair) == 2
                    and all(isinstance(t, torch.Tensor) for t in pair) for pair in stored)):
        raise CliError(f"{what} does not hold {count} (inputs, labels) tensor pairs: delete it "
                       "and the data is generated again")
    return [(x, y) for x, y in stored]


class ShardSampler(Sampler[int]):
    """Items ``rank, rank + world, ...`` (optionally in a per-epoch seeded order), padded to
    equal length across ranks when ``pad``.

    Evaluation shards this way so every example counts exactly once across processes; training
    uses ``pad=True`` so every rank takes the same number of steps (DDP needs it).
    ``done``, read each time an epoch's iteration starts, says how many of this rank's items the
    epoch has already had (a run resumed mid-epoch: the loop's restored batch count); they are
    skipped, so the epoch goes on where the interrupted one stopped, as one not interrupted
    would. ``len`` stays the whole epoch's. ``epoch``, read there too, gives the epoch whose
    order to take (the fit loop's; else the one ``set_epoch`` set): a resumed run's loader
    starts before Lightning sets the sampler's epoch, which would give a run resumed in a later
    epoch the first epoch's order.
    """

    def __init__(self, length: int, rank: int, world: int, shuffle: bool, seed: int,
                 pad: bool, done: Callable[[], int] | None = None,
                 epoch: Callable[[], int | None] | None = None):
        self.length, self.rank, self.world = length, rank, world
        self.shuffle, self.seed, self.pad, self.epoch = shuffle, seed, pad, 0
        self.done, self.current_epoch = done, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if self.shuffle:
            known = self.current_epoch() if self.current_epoch is not None else None
            gen = torch.Generator().manual_seed(self.seed + (self.epoch if known is None
                                                             else known))
            order = torch.randperm(self.length, generator=gen).tolist()
        else:
            order = list(range(self.length))
        if self.pad and self.length % self.world:
            order += order[: self.world - self.length % self.world]
        return order

    def __iter__(self):
        mine = self._order()[self.rank::self.world]
        return iter(mine[self.done():] if self.done is not None else mine)

    def __len__(self) -> int:
        return len(self._order()[self.rank::self.world])


def _as_segments(name: str, items: list[Segment | SegmentSpec], vocab_size: int,
                 power_a: float) -> list[Segment]:
    """The checked segments of ``data.<name>``; ``ValueError`` names the first bad one."""
    if not items:
        raise ValueError(f"data.{name} must list at least one segment")
    segments = []
    for i, item in enumerate(items):
        try:
            seg = as_segment(item)
            check_segment(seg, vocab_size, power_a)
        except ValueError as err:
            raise ValueError(f"data.{name}[{i}]: {err}") from None
        segments.append(seg)
    return segments


def _unique_slice_names(segments: list[Segment]) -> None:
    """Raise ``ValueError`` if two test segments share a slice name (their accuracy would mix)."""
    names = [seg.name for seg in segments]
    for i, seg_name in enumerate(names):
        if seg_name in names[:i]:
            raise ValueError(f"data.test_segments[{i}]: slice {seg_name} is already "
                             f"data.test_segments[{names.index(seg_name)}] (slice names must "
                             f"be unique)")


class MQARDataModule(L.LightningDataModule):
    """Train mixture and test slices (also used for validation), generated once per seed.

    ``train_segments`` and ``test_segments`` hold :class:`~arbench.data.segments.SegmentSpec`
    mappings (as config files write them) or :class:`~arbench.data.segments.Segment` objects.

    ``shuffle``: the training order. True (default): batches of every segment in one seeded
    shuffled order per epoch, each segment's examples shuffled once. False (zoology's): no
    shuffling; every epoch is every batch of the first segment in generation order, then the
    second, and so on.

    ``cache_dir`` (optional) stores generated tensors on disk keyed by a hash of every
    generator argument, so later runs with the same data skip generation.
    """

    def __init__(self, vocab_size: int = 8192, train_segments: list[SegmentSpec] | None = None,
                 test_segments: list[SegmentSpec] | None = None, batch_size: int = 64,
                 eval_batch_size: int = 256, seed: int = 0, power_a: float = 0.01,
                 random_non_queries: bool = True, cache_dir: str | None = None,
                 shuffle: bool = True):
        super().__init__()
        # the defaults only where none is given: an empty list stops in _as_segments
        train_segments = [Segment(64, 4, 10_000)] if train_segments is None else train_segments
        test_segments = [Segment(64, 4, 1_000)] if test_segments is None else test_segments
        for name, value in (("vocab_size", vocab_size), ("batch_size", batch_size),
                            ("eval_batch_size", eval_batch_size)):
            check_int(f"data.{name}", value)
        train_segments = _as_segments("train_segments", train_segments, vocab_size, power_a)
        test_segments = _as_segments("test_segments", test_segments, vocab_size, power_a)
        _unique_slice_names(test_segments)
        self.vocab_size = vocab_size
        self.train_segments, self.test_segments = list(train_segments), list(test_segments)
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.seed, self.power_a, self.random_non_queries = int(seed), power_a, random_non_queries
        self.cache_dir = cache_dir
        if not isinstance(shuffle, bool):
            raise ValueError(f"data.shuffle must be true or false, got {shuffle!r}")
        self.shuffle = shuffle
        self._train: SegmentBatches | None = None
        self._test: SegmentBatches | None = None

    @property
    def slice_names(self) -> list[str]:
        return [s.name for s in self.test_segments]

    def cache_key(self, segments: list[Segment], split: str) -> str:
        """16 hex digits hashing every argument that generates ``segments``' data, and the
        version of each task's generator above 1 (so data cached before a generator changed is
        not read for it, and the keys of the others stay as they were)."""
        args = dict(segments=[s.settings() for s in segments], vocab_size=self.vocab_size,
                    seed=self.seed, split=split, power_a=self.power_a,
                    random_non_queries=self.random_non_queries, version=1)
        versions = {s.task: TASKS[s.task].version for s in segments if TASKS[s.task].version > 1}
        if versions:
            args["task_versions"] = versions
        return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]

    def _generate(self, segments: list[Segment], split: str) -> list[SegmentData]:
        path = None
        if self.cache_dir:
            path = Path(self.cache_dir) / f"mqar-{split}-{self.cache_key(segments, split)}.pt"
            if path.exists():
                stored = read_cache(path, len(segments))
                return [SegmentData(seg, x, y) for seg, (x, y) in zip(segments, stored)]
        data = generate_segments(segments, self.vocab_size, self.seed, split, self.power_a,
                                 self.random_non_queries)
        if path is not None:
            # whole or not at all: a crash never leaves a half-written cache file
            atomic_write(path, lambda tmp: torch.save([(d.inputs, d.labels) for d in data], tmp))
        return data

    def setup(self, stage: str | None = None) -> None:
        if self._test is None:
            self._test = SegmentBatches(self._generate(self.test_segments, "test"),
                                        self.eval_batch_size)
        if stage in (None, "fit") and self._train is None:
            self._train = SegmentBatches(self._generate(self.train_segments, "train"),
                                         self.batch_size,
                                         shuffle_seed=self.seed if self.shuffle else None)

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _fit_loop(self):  # noqa: ANN202 (Lightning's _FitLoop, private)
        """The trainer's fit loop, None without a trainer."""
        return getattr(getattr(self, "trainer", None), "fit_loop", None)

    def _epoch_batches_done(self) -> int:
        """Training batches the current epoch has had: those of a run resumed mid-epoch (the fit
        loop's restored count, read when the epoch's iteration starts, after the loop has reset
        it for a new epoch), 0 otherwise."""
        loop = self._fit_loop()
        return int(loop.epoch_loop.batch_progress.current.ready) if loop is not None else 0

    def _epoch(self) -> int | None:
        """The fit loop's epoch (the one Lightning gives the sampler at each epoch's start, and
        a resumed run's restored one), None without a trainer."""
        loop = self._fit_loop()
        return int(loop.epoch_progress.current.processed) if loop is not None else None

    def _loader(self, ds: SegmentBatches, train: bool) -> DataLoader:
        rank, world = self._world()
        sampler = ShardSampler(len(ds), rank, world, shuffle=train and self.shuffle,
                               seed=self.seed, pad=train,
                               done=self._epoch_batches_done if train else None,
                               epoch=self._epoch if train else None)
        # its own generator: each iterator a loader starts draws a seed from it, which would
        # otherwise come from torch's global one and shift the dropout masks of a resumed run
        # (its loaders start at other points than the uninterrupted run's)
        return DataLoader(ds, batch_size=None, sampler=sampler,
                          generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        return self._loader(self._train, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._test, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._test, train=False)
