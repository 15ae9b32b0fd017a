"""The quick suite's share of a parametrized family: every case runs under `slow` (`make
test-all`); the quick suite (`make test`) keeps the few it names, at least one per property the
family checks, so that a change breaking the property fails there too."""

from __future__ import annotations

import pytest

_Param = type(pytest.param(0))


def quick(cases, keep):
    """`cases` (values, tuples of values or `pytest.param`s) with all but those in `keep` marked
    slow; `keep` holds cases (a `pytest.param` by its id) or, an int that is no case, a position
    in `cases`. An item that matches no case is an error (a renamed case must not silently leave
    the quick suite)."""
    params, keys = [], []
    for case in cases:
        param = case if isinstance(case, _Param) else None
        if param is None:
            param = pytest.param(*(case if isinstance(case, tuple) else (case,)))
        params.append(param)
        keys.append(case.id if case is param else case)
    kept = set()
    for k in keep:
        if k in keys:
            kept.update(i for i, key in enumerate(keys) if key == k)
        elif isinstance(k, int) and 0 <= k < len(cases):
            kept.add(k)
        else:
            raise ValueError(f"quick(): no case matches {k!r}")
    slow = pytest.mark.slow
    return [
        pytest.param(*p.values, id=p.id, marks=p.marks if i in kept else [*p.marks, slow])
        for i, p in enumerate(params)
    ]
