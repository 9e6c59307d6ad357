"""Argument checks shared by the analysis modules: one-line ValueErrors naming the option."""

from __future__ import annotations

import numpy as np


def positive_int(name: str, value) -> int:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  return int(value)


def nonneg_int(name: str, value) -> int:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
  return int(value)


def positive(name: str, value) -> np.ndarray:
  """Array of finite-or-infinite numbers, all > 0."""
  arr = np.asarray(value, dtype=float)
  if arr.size == 0 or np.any(np.isnan(arr)) or np.any(arr <= 0):
    raise ValueError(f"{name} must be > 0, got {value!r}.")
  return arr


def nonneg(name: str, value) -> np.ndarray:
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


def choice(name: str, value, allowed) -> str:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}.")
  return value


def out(x):
  """Python float for a 0-d result (clean doctests), the array otherwise."""
  x = np.asarray(x)
  return float(x) if x.ndim == 0 else x
