"""Optuna sweeps over arbench configs: ``python -m sweeps {run,report,status,save,restore}``."""
