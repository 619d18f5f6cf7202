"""The ``main.py`` command of a grid point, and a check that every point's command builds."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from typing import Any

from sweeps.spec import SETTING, SpecError, SweepSpec
from sweeps.trials import VARYING, point_key


def trial_args(spec: SweepSpec, params: dict[str, Any], save_dir: str, name: str) -> list[str]:
    """``main.py`` arguments (no subcommand) of one trial: configs, size, profile, the spec's
    args, the point's setting overlay (:data:`~sweeps.spec.SETTING`), then its other keys."""
    args: list[str] = []
    for cfg in spec.configs:
        args += ["--config", cfg]
    if "config" in params:  # one config file, or a list of them that compose
        cfgs = params["config"]
        for cfg in cfgs if isinstance(cfgs, (list, tuple)) else [cfgs]:
            args += ["--config", str(cfg)]
    if spec.size_path:
        args += ["--config", spec.size_path]
    args += ["--config", spec.profile_path, *spec.args]
    if SETTING in params:  # after the profile, whose task it sets to one difficulty
        args += ["--config", str(params[SETTING])]
    for key, value in params.items():
        if key not in ("config", SETTING):  # strings go bare: jsonargparse would keep JSON's quotes
            args.append(f"--{key}={value if isinstance(value, str) else json.dumps(value)}")
    args += [f"--trainer.logger.init_args.save_dir={save_dir}",
             f"--trainer.logger.init_args.name={name}",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    return args


FIT_HELP = "python main.py fit --help"
"""Where a grid key's options are listed: the grid sets ``main.py fit``'s keys."""


def parser_reason(stderr: str) -> str:
    """The reason in main.py's parser error output (its ``error:`` line, less the pointer to
    ``--help`` of the program it ran in, which here is no main.py)."""
    for line in stderr.splitlines():
        if line.startswith("error: "):
            return line.removeprefix("error: ").strip()
    return "not a valid main.py configuration"


def validate_points(spec: SweepSpec) -> None:
    """Instantiate model and data of every distinct point (seed and lr aside); bad values
    raise SpecError."""
    from arbench.cli import CliError, build_cli  # here: keeps torch out of CLI start-up

    seen = set()
    with tempfile.TemporaryDirectory() as tmp:
        for point in spec.points():
            key = point_key(point)
            if key in seen:
                continue
            seen.add(key)
            shown = json.dumps({k: v for k, v in point.items() if k not in VARYING},
                               sort_keys=True)
            said = io.StringIO()
            try:
                with contextlib.redirect_stderr(said):
                    build_cli(trial_args(spec, point, tmp, "check"), run=False)
            except CliError as err:
                raise SpecError(f"grid point {shown}: {err}") from None
            except SystemExit:
                raise SpecError(f"grid point {shown}: {parser_reason(said.getvalue())} (run "
                                f"`{FIT_HELP}` for the accepted options)") from None
            sys.stderr.write(said.getvalue())  # a warning of a point that builds still shows
