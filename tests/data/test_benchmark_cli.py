"""``python -m arbench.data.benchmark``: bad sizes are one ``error:`` line naming the command."""

import pytest

from arbench.data.benchmark import main

HELP = " (run `python -m arbench.data.benchmark --help` for the options)"


@pytest.mark.parametrize("argv,message", [
    (["--examples", "-5"], "error: --examples must be an integer >= 1, got -5"),
    (["--repeats", "0"], "error: --repeats must be an integer >= 1, got 0"),
    (["--baseline-examples", "-1"], "error: --baseline-examples must be an integer >= 0, got -1"),
    (["--seq-len", "4", "--pairs", "8"], "error: seq_len=4 is too short for num_kv_pairs=8"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message) and lines[0].endswith(HELP)


def test_tiny_run_prints_both_rates(capsys):
    main(["--examples", "8", "--seq-len", "32", "--pairs", "4", "--vocab", "64", "--repeats",
          "1", "--baseline-examples", "4"])
    out = capsys.readouterr().out
    assert "generate_mqar: 8 examples" in out and "per-example numpy baseline" in out
