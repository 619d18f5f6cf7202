"""Expected run times and ``sweeps run --until``: which queued runs a worker starts before a
deadline, and the deadline's forms."""

import datetime
import re
import time

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial
from test_sweeps import sweep, write_spec

from sweeps.runtime import expected_seconds, parse_until, timed_runs
from sweeps.spec import SpecError
from sweeps.worker import Deadline, claim_waiting

NOW = datetime.datetime(2026, 12, 6, 20, 0, 0)
P = "model.feature_map.init_args.p"


def test_a_deadline_is_a_clock_time_a_span_or_a_date():
    assert parse_until("21:40", NOW) == NOW.replace(hour=21, minute=40)
    assert parse_until("19:30", NOW) == datetime.datetime(2026, 12, 7, 19, 30)  # tomorrow's
    assert parse_until("+90m", NOW) == parse_until("+1h30m", NOW) == NOW.replace(hour=21,
                                                                                minute=30)
    assert parse_until("+2h", NOW) == NOW.replace(hour=22)
    assert parse_until("2026-12-08T06:00", NOW) == datetime.datetime(2026, 12, 8, 6, 0)
    for bad in ("25:00", "+", "+5s", "soon", "21:4"):
        with pytest.raises(SpecError, match=r"^--until .* is not HH:MM, \+<H>h<M>m"):
            parse_until(bad, NOW)


def finished(p: int, seconds: float, reused: bool = False) -> optuna.trial.FrozenTrial:
    attrs = {"wall_time_s": seconds, **({"reused_from": "other#0"} if reused else {})}
    return create_trial(state=TrialState.COMPLETE, value=0.5, params={P: p},
                        distributions={P: IntDistribution(2, 8)}, user_attrs=attrs)


def test_a_queued_run_is_timed_by_its_nearest_finished_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="t", storage=url, direction="maximize")
    for t in (finished(2, 100.0), finished(2, 300.0), finished(4, 1000.0),
              finished(6, 50.0, reused=True)):
        study.add_trial(t)
    for p in (2, 4, 6):
        study.enqueue_trial({P: p})
    timed = timed_runs(study.get_trials())
    queued = study.get_trials(states=(TrialState.WAITING,))
    # p=2: median of its own two runs; p=4: its own; p=6: only a reused run shares its p
    assert [expected_seconds(t, timed) for t in queued] == [200.0, 1000.0, 50.0]
    assert expected_seconds(queued[0], []) is None
    # the deadline's bound leaves out pruned runs, and times a point like no completed run
    # by the longest: a p=8 point after runs at p=2, 4 and 6
    study.add_trial(create_trial(state=TrialState.PRUNED, value=0.1, params={P: 2},
                                 distributions={P: IntDistribution(2, 8)},
                                 user_attrs={"wall_time_s": 10.0}))
    timed = timed_runs(study.get_trials())
    p8 = create_trial(state=TrialState.WAITING, params={P: 8},
                      distributions={P: IntDistribution(2, 8)})
    assert [expected_seconds(t, timed) for t in (*queued, p8)] == [100.0, 1000.0, 50.0, 200.0]
    assert [expected_seconds(t, timed, conservative=True) for t in (*queued, p8)] == \
        [200.0, 1000.0, 50.0, 1000.0]

    # a deadline 10 minutes away: p=4 (~17 min) is passed over, p=2 claimed first
    deadline = Deadline(time.time() + 600, study.get_trials())
    storage = optuna.storages.RDBStorage(url)
    first = claim_waiting(study, storage, deadline.fits)
    second = claim_waiting(study, storage, deadline.fits)
    numbers = {storage.get_trial(i).number for i in (first, second)}
    assert numbers == {queued[0].number, queued[2].number}
    assert claim_waiting(study, storage, deadline.fits) is None  # p=4 stays queued
    assert study.get_trials()[queued[1].number].state == TrialState.WAITING
    line = deadline.stop_line([queued[1]])
    assert "none of the 1 queued run(s) is expected to end by then" in line
    assert "~17 min" in line


def test_a_worker_stops_before_a_deadline_its_next_run_would_pass(tmp_path):
    spec = write_spec(tmp_path, "late", {"seed_everything": [0, 1, 2]})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(spec), "--storage", url, "--trials", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    # the one finished run times the others (seconds each): none ends within the second
    # left, so the worker starts nothing and says why
    soon = (datetime.datetime.now() + datetime.timedelta(seconds=1)).isoformat()
    out = sweep("run", str(spec), "--storage", url, "--until", soon, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stopping before" in out.stdout and "none of the 2 queued run(s)" in out.stdout
    assert "(this process ran 0)" in out.stdout and "waiting 2" in out.stdout
    out = sweep("run", str(spec), "--storage", url, "--until", "+2h", cwd=tmp_path)
    assert out.returncode == 0 and "(this process ran 2)" in out.stdout, out.stdout
    said = re.search(r"starting only runs expected to end by (\S+ \S+)", out.stdout)[1]
    later = datetime.datetime.now() + datetime.timedelta(hours=2)
    assert abs(datetime.datetime.fromisoformat(said) - later) < datetime.timedelta(minutes=3)
    out = sweep("run", str(spec), "--storage", url, "--until", "later", cwd=tmp_path)
    assert out.returncode == 2 and "error: --until 'later' is not HH:MM" in out.stderr
