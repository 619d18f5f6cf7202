import csv
import dataclasses
import json

import arbench.approx.ledger as ledger
from arbench.approx.cli import main
from arbench.approx.ledger import LEDGER_NAME
from arbench.approx.qkset import save_qk
from arbench.approx.records import Record, StudyConfig
from arbench.approx.synthetic import synthetic_qk

TINY = ["--synthetic", "--layers", "0", "1", "--head-dim", "4", "--p", "2", "--m", "8",
        "--steps", "15", "--lr", "1e-2", "--n-train", "64", "--n-test", "32", "--num-seqs", "4",
        "--seq-len", "32", "--methods", "mlp", "llops", "--als-sweeps", "5", "--polish-steps", "20"]


def scores(out):
    """table.csv without the fit times, which a resumed run cannot reproduce."""
    with (out / "table.csv").open() as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def test_a_killed_study_resumes_with_the_same_table(tmp_path, capsys):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*TINY, "--ranks", "1", "2", "--out", str(full)]) == 0
    lines = (full / LEDGER_NAME).read_text().splitlines()
    assert len(lines) == 1 + 2 * 3  # settings + layers x (MLP, LLoPS t=1, t=2)
    cut.mkdir()
    # the settings, three finished fits and a fourth line cut short by the kill
    (cut / LEDGER_NAME).write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    capsys.readouterr()
    assert main([*TINY, "--ranks", "1", "2", "--out", str(cut)]) == 0
    printed = capsys.readouterr().out
    assert "resuming: 3 fits" in printed
    assert printed.count(f": from {cut / LEDGER_NAME}") == 3
    assert printed.count("steps (") == 3  # only the other three were fitted
    assert scores(cut) == scores(full)
    resumed = [json.loads(x) for x in (cut / LEDGER_NAME).read_text().splitlines()]
    assert len(resumed) == len(lines)  # the cut line was dropped, its fit stored again


def test_another_rank_reuses_the_finished_fits(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*TINY, "--ranks", "1", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": from ") == 4 and printed.count("steps (") == 2  # t=2 on two layers
    assert {r["method"] for r in scores(out)} >= {"LLoPS t=1", "LLoPS t=2", "2-layer MLP"}


def test_other_settings_are_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*TINY, "--ranks", "1", "--steps", "16", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "other settings" in err and "\n" not in err


def test_fits_recorded_before_machines_were_named_say_so(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    lines = (out / LEDGER_NAME).read_text().splitlines()
    old = [lines[0], *(json.dumps({k: v for k, v in json.loads(x).items() if k != "machine"})
                       for x in lines[1:])]
    (out / LEDGER_NAME).write_text("\n".join(old) + "\n")
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    text = (out / "table.md").read_text()
    # the four stored fits name no machine; the floors and data limits, recomputed, do
    assert "computed on: not recorded (4); floor and data-limit cells on: " in text


def test_processes_on_separate_layers_and_degrees_fill_one_folder(tmp_path, capsys):
    """A teacher's (or a saved extraction's) layers do not depend on which others were taken,
    nor a fit at p on the other degrees: runs on parts of the study share the folder, and the
    whole study then refits nothing and gives the uninterrupted run's table."""
    saved = tmp_path / "qk.pt"
    save_qk(synthetic_qk([0, 1], head_dim=4, num_seqs=4, seq_len=32), saved)
    parts = tmp_path / "parts"
    args = [a for a in TINY if a != "--synthetic"]
    args = args[:args.index("--layers")] + args[args.index("--head-dim"):]
    args = [*args[:args.index("--p")], *args[args.index("--p") + 2:], "--qk", str(saved),
            "--ranks", "1"]
    assert main([*args, "--layers", "1", "--p", "2", "--out", str(parts)]) == 0
    assert (parts / "table.md").exists()  # the file's every fit so far: its tables
    capsys.readouterr()
    assert main([*args, "--layers", "0", "--p", "2", "3", "--out", str(parts)]) == 0
    # a part beside others' fits writes no table of itself that would pass for the study's,
    # and removes the one the first part wrote, now of part of the file
    printed = capsys.readouterr().out
    assert "outside this run's selection" in printed and "removed " in printed
    assert not list(parts.glob("table.*")) and not (parts / "error_vs_rank.png").exists()
    assert main([*args, "--layers", "1", "--p", "3", "--out", str(parts)]) == 0
    printed = capsys.readouterr().out
    assert "outside this run's selection" in printed and "removed " not in printed
    assert main([*args, "--layers", "0", "1", "--p", "2", "3", "--out", str(parts)]) == 0
    assert capsys.readouterr().out.count("steps (") == 0  # every fit came from the parts
    whole = tmp_path / "whole"
    assert main([*args, "--layers", "0", "1", "--p", "2", "3", "--out", str(whole)]) == 0
    assert scores(parts) == scores(whole)
    lines = (parts / LEDGER_NAME).read_text().splitlines()
    assert sum("settings" in json.loads(x) for x in lines) == 1 and len(lines) == 1 + 2 * 2 * 2


def test_synthetic_layers_drawn_together_keep_their_selection(tmp_path, capsys):
    """Synthetic queries and keys are drawn for the layers asked, together, so another
    selection is other data: refused."""
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0  # layers 0 and 1
    capsys.readouterr()
    others = [*TINY[:TINY.index("--layers") + 1], "0", *TINY[TINY.index("--head-dim"):]]
    assert main([*others, "--ranks", "1", "--out", str(out)]) == 2
    assert "other settings" in capsys.readouterr().err


def test_a_setting_added_later_keeps_older_record_files_resumable_at_its_default(tmp_path,
                                                                                  capsys):
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    head = json.loads((out / LEDGER_NAME).read_text().splitlines()[0])
    assert "val_seqs" not in head["settings"]["study"]  # as written before it existed
    capsys.readouterr()
    assert main([*TINY, "--ranks", "1", "--val-seqs", "2", "--out", str(out)]) == 2
    assert "other settings" in capsys.readouterr().err


def test_fits_of_earlier_fitting_code_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """A records file written before the fitting code's version was raised is not read into
    a table beside new fits; at version 1 the settings line is as files have it."""
    out = tmp_path / "out"
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 0
    head = json.loads((out / LEDGER_NAME).read_text().splitlines()[0])
    assert "fit_version" not in head["settings"]
    capsys.readouterr()
    monkeypatch.setattr(ledger, "FIT_VERSION", 2)
    assert main([*TINY, "--ranks", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "another version of the fitting code (fit version 1, this code's 2)" in err
    assert err.startswith("error: ") and "\n" not in err
    assert main([*TINY, "--ranks", "1", "--out", str(tmp_path / "new")]) == 0
    head = json.loads((tmp_path / "new" / LEDGER_NAME).read_text().splitlines()[0])
    assert head["settings"]["fit_version"] == 2


def record(method: str, layer: int = 0, p: int = 2) -> Record:
    return Record(p=p, method=method, layer=layer, head=0, rmae=0.5,
                         rel_frobenius=0.4, feature_dim=8, seconds=1.0)


def tiny_ledger(out, steps: int = 10, repair: bool = True) -> ledger.Ledger:
    config = StudyConfig(fit=dataclasses.replace(StudyConfig().fit, steps=steps))
    return ledger.Ledger(out, config, {"meta": {"source": "test"}}, repair=repair)


def test_an_append_under_other_settings_is_refused(tmp_path):
    """Two processes that both began on an empty folder with other settings: the second to
    append finds the first's settings line and stops, rather than store its fit under them."""
    first, second = tiny_ledger(tmp_path, steps=10), tiny_ledger(tmp_path, steps=2000)
    first.add(record("LLoPS t=1"))
    try:
        second.add(record("2-layer MLP"))
    except ValueError as exc:
        assert "other settings" in str(exc)
    else:
        raise AssertionError("an append under other settings was accepted")
    assert set(tiny_ledger(tmp_path, steps=10).done) == {(0, 0, 2, "LLoPS t=1")}


def test_a_line_a_killed_writer_left_is_cut_before_the_next_append(tmp_path):
    """A writer killed mid-line leaves no newline; the next append (by a process that was
    already running, so did no repair) cuts that remnant off instead of gluing onto it."""
    running = tiny_ledger(tmp_path)
    running.add(record("LLoPS t=1"))
    with (tmp_path / LEDGER_NAME).open("a") as fh:
        fh.write(json.dumps(dataclasses.asdict(record("Flatten")))[:25])
    running.add(record("2-layer MLP", layer=1))
    again = tiny_ledger(tmp_path)
    assert set(again.done) == {(0, 0, 2, "LLoPS t=1"), (1, 0, 2, "2-layer MLP")}
    assert (tmp_path / LEDGER_NAME).read_text().count("\n") == 3


def test_a_reader_skips_a_line_being_written_and_a_repair_cuts_it(tmp_path):
    out = tiny_ledger(tmp_path)
    out.add(record("LLoPS t=1"))
    path = tmp_path / LEDGER_NAME
    whole = path.read_text()
    path.write_text(whole + '{"p": 2, "meth')
    assert len(tiny_ledger(tmp_path, repair=False).done) == 1
    assert path.read_text().endswith('"meth')  # a reader leaves the file alone
    assert len(tiny_ledger(tmp_path).done) == 1
    assert path.read_text() == whole


def test_short_writes_are_completed(tmp_path, monkeypatch):
    """``os.write`` may write fewer bytes than asked (a signal, a nearly full disk)."""
    real = ledger.os.write
    monkeypatch.setattr(ledger.os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    out = tiny_ledger(tmp_path)
    out.add(record("LLoPS t=1"))
    out.add(record("Flatten"))
    monkeypatch.undo()
    assert set(tiny_ledger(tmp_path).done) == {(0, 0, 2, "LLoPS t=1"), (0, 0, 2, "Flatten")}

