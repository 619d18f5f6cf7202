"""Whole-or-nothing writes: a writer that fails leaves the old file and no temporary file."""

import pytest

from arbench.files import atomic_write


def test_atomic_write_replaces_the_file_and_creates_its_folder(tmp_path):
    path = tmp_path / "a" / "b.txt"
    assert atomic_write(path, lambda tmp: tmp.write_text("new")) == path
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["b.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "b.txt"
    path.write_text("old")

    def half_then_crash(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_crash)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["b.txt"]
