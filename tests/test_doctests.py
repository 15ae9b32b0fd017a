"""Every public name (``__all__`` of jaxhc and its packages) has a docstring with an example that
runs, and the examples give what they say: run as doctests, in a process of their own on 8
simulated host devices (some initialize MPI as a one-process job)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import subprocess
import sys

# jaxhc.model is left out for now: its public API is being extended (LLaMA models) elsewhere.
MODULES = [
    "jaxhc",
    "jaxhc.accounting",
    "jaxhc.codecs",
    "jaxhc.collectives",
    "jaxhc.context",
    "jaxhc.data",
    "jaxhc.host_memory",
    "jaxhc.launch",
    "jaxhc.partition",
    "jaxhc.plan",
    "jaxhc.policy",
    "jaxhc.schema",
    "jaxhc.transport",
]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _globs() -> dict:
    """The names every example may use without importing them (as numpy's docs assume np)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxhc

    return {"jax": jax, "jnp": jnp, "np": np, "jaxhc": jaxhc}


def _public():
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            yield module, attr, getattr(module, attr)


def _examples(module, attr, obj) -> list[doctest.DocTest]:
    """The doctests of a public name: its own docstring's; for a constant or type alias (no
    docstring of its own) those of its module's docstring that use its name."""
    own = callable(obj) and not isinstance(obj, type(int | None)) or inspect.ismodule(obj)
    holder = obj if own else module
    finder = doctest.DocTestFinder(recurse=False, exclude_empty=True)
    tests = finder.find(holder, f"{module.__name__}.{attr}", globs=_globs())
    if not own:
        tests = [t for t in tests if any(attr in ex.source for ex in t.examples)]
    return tests


def _runnable(test: doctest.DocTest) -> bool:
    return any(not ex.options.get(doctest.SKIP) for ex in test.examples)


def main() -> int:
    """Run every public name's examples once; print what is missing or failed."""
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    missing, seen = [], set()
    for module, attr, obj in _public():
        tests = _examples(module, attr, obj)
        if not any(_runnable(t) for t in tests):
            missing.append(f"{module.__name__}.{attr}")
        for test in tests:
            key = (test.filename, test.lineno, test.docstring)
            if key not in seen:
                seen.add(key)
                runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    if missing:
        print(f"no runnable example in the docstring of {missing}")
    print(f"{attempted} examples, {failed} failed")
    return 1 if failed or missing or not attempted else 0


def test_every_public_name_has_a_runnable_example_that_runs():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(main())
