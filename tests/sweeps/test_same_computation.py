"""``python -m sweeps.same_computation``: two checkouts' training compared bit for bit."""

import pytest
import torch
from paths import ROOT, SMOKE

from sweeps.same_computation import compare, main


def test_compare_names_the_first_tensor_that_differs():
    a = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    assert compare(a, {k: v.clone() for k, v in a.items()}) == (True, "bit-identical (2 tensors)")
    nudged = {"w": a["w"].clone(), "b": a["b"] + 1e-7}
    same, message = compare(a, nudged)
    assert not same and message.startswith("b differs (largest absolute difference 1e-07")
    assert compare(a, {"w": a["w"]}) == (False, "different tensors: b")
    assert not compare(a, {"w": a["w"].double(), "b": a["b"]})[0]


def test_a_checkout_against_itself_is_bit_identical(capsys):
    assert main([str(ROOT), "--steps", "3", "--", "--config", "configs/p2.yaml", *SMOKE]) == 0
    assert "bit-identical (" in capsys.readouterr().out


def test_a_failing_run_and_bad_input_stop_with_one_line(tmp_path, capsys):
    assert main([str(ROOT), "--steps", "2", "--", "--config", "configs/p2.yaml", *SMOKE,
                 "--model.lr", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: main.py fit in ")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--", "--config", "configs/p2.yaml"])
    assert "has no main.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(ROOT), "--config", "configs/p2.yaml"])
    assert "after --" in capsys.readouterr().err
