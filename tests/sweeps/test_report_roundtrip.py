"""An archive restored into an empty storage reports the tables it was committed with.

``data/roundtrip/``: the ``calibration_long`` study's lines of ``results/sweep_archive.jsonl``,
a copy of its spec, and the ``table.md``, ``table.csv``, ``runs.csv`` and ``halving.md`` that
``python -m sweeps report`` wrote from them when they were taken (those then committed under
``results/calibration_long/``). A change to what a report writes changes these files too.
"""

from pathlib import Path

from sweeps.__main__ import main

DATA = Path(__file__).resolve().parent / "data" / "roundtrip"
FILES = ("table.md", "table.csv", "runs.csv", "halving.md")


def test_restore_then_report_gives_the_committed_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main(["restore", str(DATA / "archive.jsonl"), "--storage", url]) == 0
    assert capsys.readouterr().out == "restored calibration_long: 9 trial(s)\n"
    out = tmp_path / "results"
    assert main(["report", str(DATA / "calibration_long.yaml"), "--storage", url,
                 "--out", str(out)]) == 0
    written = sorted(p.name for p in (out / "calibration_long").iterdir())
    assert written == sorted([*FILES, "learning_curves.png"])
    for name in FILES:
        got = (out / "calibration_long" / name).read_text()
        want = (DATA / "expected" / name).read_text()
        assert got == want, name

