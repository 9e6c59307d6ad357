"""Checks of array-like numeric arguments (numpy broadcasting), one-line ValueErrors naming them.

Scalars and options (integers, reals, choices, the schedule H, P, τ) are checked by
``diloco_core.spec.validity``, shared with the trainer; only what is specific to arrays is here.
"""

from __future__ import annotations

import numpy as np


def positive(name: str, value) -> np.ndarray:
  """Array of finite-or-infinite numbers, all > 0."""
  arr = np.asarray(value, dtype=float)
  if arr.size == 0 or np.any(np.isnan(arr)) or np.any(arr <= 0):
    raise ValueError(f"{name} must be > 0, got {value!r}.")
  return arr


def positive_integers(name: str, value) -> np.ndarray:
  """Array of whole numbers, all >= 1 (as floats)."""
  arr = positive(name, value)
  if np.any(arr != np.round(arr)):
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  return arr


def nonneg(name: str, value) -> np.ndarray:
  """Array of numbers, all >= 0."""
  arr = np.asarray(value, dtype=float)
  if arr.size == 0 or np.any(np.isnan(arr)) or np.any(arr < 0):
    raise ValueError(f"{name} must be >= 0, got {value!r}.")
  return arr


def fraction(name: str, value) -> np.ndarray:
  """Array of numbers strictly inside (0, 1)."""
  arr = np.asarray(value, dtype=float)
  if arr.size == 0 or np.any(np.isnan(arr)) or np.any(arr <= 0) or np.any(arr >= 1):
    raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}.")
  return arr


def out(x):
  """Python float for a 0-d result (clean doctests), the array otherwise."""
  x = np.asarray(x)
  return float(x) if x.ndim == 0 else x
