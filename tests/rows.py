"""What the tests of others' formats compare: a value as pyarrow's ``to_pylist`` gives it."""

import numpy as np


def norm(x):
    """``x`` with numpy scalars as Python numbers and arrays as lists, recursively (dicts, lists)."""
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return [norm(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, list):
        return [norm(v) for v in x]
    return x
