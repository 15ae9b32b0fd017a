"""The quick suite's share of a parametrized family: every case runs under `slow` (`make
test-all`); the quick suite (`make test`) keeps the few it names, at least one per property the
family checks, so that a change breaking the property fails there too."""

from __future__ import annotations

import pytest

_Param = type(pytest.param(0))


def quick(cases, keep):
    """`cases` (values, tuples of values or `pytest.param`s) with all but those in `keep` marked
    slow; `keep` holds cases (a `pytest.param` by its id) or their positions in `cases`."""
    keep, out = list(keep), []
    for i, case in enumerate(cases):
        param = case if isinstance(case, _Param) else None
        if param is None:
            values = case if isinstance(case, tuple) else (case,)
            param = pytest.param(*values)
        kept = i in keep or (case.id if case is param else case) in keep
        marks = param.marks if kept else [*param.marks, pytest.mark.slow]
        out.append(pytest.param(*param.values, id=param.id, marks=marks))
    return out
