"""The storage URL's password never shows (``sweeps.secrets``): not in any command's output,
not in a worker's command line, not in what a sweep writes."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweeps import GRID4, sweep, write_spec

from arbench.checks import CliError
from sweeps.__main__ import main
from sweeps.secrets import (
    ENV_VAR,
    argv_without_storage,
    given_storage,
    masked,
    password,
    passwords,
    scrub,
    worker_env,
)
from sweeps.storage import StorageError, open_storage

PASSWORD = "s3cretPW-4711"
UNREACHABLE = f"postgresql://alice:{PASSWORD}@127.0.0.1:1/db"
PG_URL = os.environ.get("ARBENCH_TEST_PG_URL")


def test_masked_hides_only_the_password():
    assert masked(UNREACHABLE) == "postgresql://alice:***@127.0.0.1:1/db"
    assert masked("sqlite:///runs/sweeps.db") == "sqlite:///runs/sweeps.db"
    assert masked("postgresql://bob@host/db") == "postgresql://bob@host/db"
    assert masked("not a url://u:pw123@h") == "<storage URL>"  # unparsed: not shown at all


def test_scrub_removes_every_copy_of_the_password():
    text = f"cannot open {UNREACHABLE}: password {PASSWORD} rejected"
    out = scrub(text, UNREACHABLE)
    assert PASSWORD not in out and "alice:***@127.0.0.1" in out
    encoded = "postgresql://alice:p%40ss-word@h/db"  # '@' in a password is %-encoded
    assert "p@ss-word" not in scrub("driver says p@ss-word", encoded)
    assert scrub("nothing secret", None) == "nothing secret"


LEAKY = {  # each a URL whose password an earlier masking showed in an error line
    "query parameter": "postgresql://alice@127.0.0.1:1/db?password=TopSecret99",
    "raw @ in it": "postgresql://alice:p@ssTopSecret99@127.0.0.1:1/db",
    "one-slash typo": "postgresql:/alice:TopSecret99@127.0.0.1:1/db",
    "no scheme": "alice:TopSecret99@127.0.0.1:1/db",
    "libpq keys in the query": "postgresql:///db?host=127.0.0.1&port=1&user=alice&"
                               "password=TopSecret99",
    "bad port": "postgresql://alice:TopSecret99@127.0.0.1:xx/db",
}


def test_masked_finds_the_password_in_every_form():
    assert masked(LEAKY["query parameter"]) == "postgresql://alice@127.0.0.1:1/db?password=***"
    assert masked(LEAKY["raw @ in it"]) == "postgresql://alice:***@127.0.0.1:1/db"
    assert masked(LEAKY["libpq keys in the query"]).endswith("&user=alice&password=***")
    for unparsed in ("one-slash typo", "no scheme", "bad port"):
        assert masked(LEAKY[unparsed]) == "<storage URL>"
    assert passwords(LEAKY["raw @ in it"]) == ["p@ssTopSecret99"]
    assert passwords("postgresql://u:pw1@h/db?sslpassword='a b c'&password=xyz") == \
        ["pw1", "a b c", "xyz"]
    assert passwords("sqlite:///odd:name@x.db") == []  # a path, not a user and password
    for url in LEAKY.values():
        assert password(url) is not None  # so --storage URL prints its note
        assert "Secret99" not in scrub(f"host 'ssTopSecret99@127.0.0.1' rejects {url}", url)


@pytest.mark.parametrize("what", list(LEAKY))
def test_cannot_open_storage_never_shows_the_password(what):
    with pytest.raises(StorageError, match="^cannot open storage ") as caught:
        open_storage(LEAKY[what])
    assert "Secret99" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_password_in_the_query_gets_the_process_list_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert main(["status", "--storage", LEAKY["query parameter"]]) == 2
    note, error = capsys.readouterr().err.strip().splitlines()
    assert note.startswith("note: --storage shows its password to every user")
    assert error.startswith("error: cannot open storage postgresql://alice@127.0.0.1:1/db?"
                            "password=***: ")
    assert "Secret99" not in error


def test_storage_options_leave_a_workers_command_line():
    argv = ["run", "a.yaml", "--storage", UNREACHABLE, "--workers", "2",
            f"--storage={UNREACHABLE}", "--storage-file", "/x", "--storage-f=/y", "--size",
            "tiny"]
    assert argv_without_storage(argv) == ["run", "a.yaml", "--workers", "2", "--size", "tiny"]
    env = worker_env({"PATH": "/bin", ENV_VAR: "old"}, UNREACHABLE)
    assert env == {"PATH": "/bin", ENV_VAR: UNREACHABLE}
    assert ENV_VAR not in worker_env({ENV_VAR: "old"}, None)


def test_given_storage_precedence_and_file_errors(tmp_path, monkeypatch):
    file = tmp_path / "url"
    file.write_text(f"\n  {UNREACHABLE}  \n")
    monkeypatch.setenv(ENV_VAR, "sqlite:///env.db")
    assert given_storage("sqlite:///flag.db", None) == "sqlite:///flag.db"
    assert given_storage(None, str(file)) == UNREACHABLE
    assert given_storage(None, None) == "sqlite:///env.db"
    monkeypatch.delenv(ENV_VAR)
    assert given_storage(None, None) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CliError, match="is empty"):
        given_storage(None, str(tmp_path / "empty"))
    with pytest.raises(CliError, match="cannot read it"):
        given_storage(None, str(tmp_path / "missing"))
    with pytest.raises(CliError, match="not both"):
        given_storage("sqlite:///a.db", str(file))


def commands(tmp_path: Path, spec: Path) -> list[list[str]]:
    """Every sweep command, each reading the storage from the same place."""
    return [["run", str(spec), "--threads", "1"], ["status"],
            ["report", str(spec), "--out", str(tmp_path / "results")],
            ["save", str(tmp_path / "archive.jsonl")],
            ["restore", str(tmp_path / "archive.jsonl")]]


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_an_unreachable_storage_is_named_without_its_password(tmp_path, how):
    spec = write_spec(tmp_path, "secret", {"seed_everything": [0]})
    (tmp_path / "archive.jsonl").write_text("")
    (tmp_path / "url").write_text(UNREACHABLE + "\n")
    extra = {"flag": ["--storage", UNREACHABLE], "env": [],
             "file": ["--storage-file", str(tmp_path / "url")]}[how]
    env = {**os.environ, ENV_VAR: UNREACHABLE} if how == "env" else None
    for args in commands(tmp_path, spec):
        out = subprocess.run([sys.executable, "-m", "sweeps", *args, *extra], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
        *note, error = out.stderr.strip().splitlines()
        assert error.startswith("error: cannot open storage postgresql://alice:***@")
        assert note == (["note: --storage shows its password to every user of this machine "
                         "(the process list); give the URL in $ARBENCH_STORAGE or "
                         "--storage-file instead"] if how == "flag" else [])
        assert PASSWORD not in out.stdout + out.stderr, args


def worker_processes(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def watch_workers(proc: subprocess.Popen, timeout: float = 240) -> list[tuple[bytes, bytes]]:
    """``(cmdline, environ)`` of each worker process ``proc`` starts, read while it runs (once
    the worker runs its own program: between fork and exec a child still shows its parent's
    command line and environment)."""
    seen: dict[int, tuple[bytes, bytes]] = {}
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        for pid in worker_processes(proc.pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                if b"ARBENCH_SWEEP_WORKER=" in environ:  # exec'd: its own environment
                    seen[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes(), environ)
            except OSError:
                continue
        time.sleep(0.2)
    return list(seen.values())


def test_workers_get_the_storage_in_their_environment_not_their_arguments(tmp_path):
    url = f"sqlite:///{tmp_path / 'hidden-name.sqlite'}"
    spec = write_spec(tmp_path, "argv", GRID4)
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", "run", str(spec), "--storage", url,
                             "--workers", "2", "--threads", "1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = watch_workers(proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert workers, "no worker process was seen"
    for cmdline, environ in workers:
        assert b"hidden-name" not in cmdline and b"--storage" not in cmdline
        assert f"{ENV_VAR}={url}".encode() in environ.split(b"\0")


@pytest.mark.skipif(not PG_URL, reason="no PostgreSQL server given (set ARBENCH_TEST_PG_URL; "
                                       ".ci/run does)")
def test_no_output_of_any_command_shows_the_password(tmp_path):
    """A sweep on PostgreSQL (which trusts loopback, so any password is accepted) with the
    password given on the parent's command line: every command's output, each worker's command
    line and every file the sweep writes are free of it."""
    from sqlalchemy.engine import make_url

    url = make_url(PG_URL).set(password=PASSWORD).render_as_string(hide_password=False)
    study = f"secret{int(time.time() * 1000)}"
    spec = write_spec(tmp_path, study, {"seed_everything": [0, 1]})
    run, *others = commands(tmp_path, spec)
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", *run, "--storage", url,
                             "--workers", "2"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    workers = watch_workers(proc)
    outputs = list(proc.communicate(timeout=300))
    assert proc.returncode == 0, outputs[1][-2000:]
    assert workers and all(PASSWORD.encode() not in cmdline for cmdline, _ in workers)
    for args in others:
        out = sweep(*args, "--storage", url, cwd=tmp_path, check=True)
        outputs += [out.stdout, out.stderr]
    assert f"kept {study}" in outputs[-2]  # restore ran and found the study
    assert not any(PASSWORD in text for text in outputs)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name.startswith("events.out.tfevents") for p in written)
    assert [p for p in written if PASSWORD.encode() in p.read_bytes()] == []
