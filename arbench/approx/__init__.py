"""Kernel-approximation study: how well m-dimensional feature maps reproduce (q·k)^p.

Queries and keys come from a softmax teacher (:mod:`~arbench.approx.extract`), a saved file
(:mod:`~arbench.approx.qkset`) or a synthetic generator; :mod:`~arbench.approx.study` fits and
scores the methods of :mod:`~arbench.approx.methods` against the Eckart–Young floor of
:mod:`~arbench.approx.floor`; :mod:`~arbench.approx.report` writes the table and plot. A fit
(:mod:`~arbench.approx.fit`) starts from the data where the map allows it
(:mod:`~arbench.approx.starts`, LLoPS by :mod:`~arbench.approx.als`), else from Adam, and ends
with full-batch L-BFGS to a stationary point (:mod:`~arbench.approx.polish`).
"""

from arbench.approx.extract import extract_from_teacher, extract_qk, load_teacher
from arbench.approx.floor import eckart_young, fitted_optimal_sketch, optimal_linear_sketch
from arbench.approx.metrics import rel_frobenius, rmae
from arbench.approx.qkset import QKSet, load_qk, save_qk
from arbench.approx.study import Record, StudyConfig, run_study

__all__ = ["QKSet", "Record", "StudyConfig", "eckart_young", "extract_from_teacher", "extract_qk",
           "fitted_optimal_sketch", "load_qk", "load_teacher", "optimal_linear_sketch",
           "rel_frobenius", "rmae", "run_study", "save_qk"]
