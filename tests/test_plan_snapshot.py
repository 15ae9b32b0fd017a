"""The planner's predictions over the shipped model presets, clusters and policies are those of
tests/planner_snapshot.json (tests/planner_snapshot.py says what a case records): a refactor that
should change no prediction changes none."""

from __future__ import annotations

import json

from tests import planner_snapshot as snap


def test_the_planner_predicts_what_the_expectation_file_holds():
    expected = json.loads(snap.EXPECTED.read_text())
    diff = snap.differences(expected, snap.snapshot())
    assert not diff, (
        "the planner's predictions differ from tests/planner_snapshot.json:\n"
        + "\n".join(diff[:40])
        + f"\nif the change is intended, regenerate it: {snap.REGENERATE}"
    )
