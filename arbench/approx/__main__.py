"""``python -m arbench.approx``: see :mod:`arbench.approx.cli`."""

from arbench.approx.cli import main

raise SystemExit(main())
