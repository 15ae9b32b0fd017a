"""The user documentation's commands run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    """docs/quickstart.md's shell blocks after the setup one, in order, in a fresh folder, with
    this environment's jaxhc and python first on PATH and no XLA_FLAGS (as a user runs them)."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks[0].startswith("make setup")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1")
    for block in blocks[1:]:
        done = subprocess.run(
            ["bash", "-e", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    meta = json.loads((tmp_path / "data" / "mine" / "meta.json").read_text())
    assert meta["tokenizer"]["spec"] == "bpe:4096"
    for run, steps in (("mine", 200), ("mine-more", 20)):
        assert len((tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()) == steps
    assert (tmp_path / "exported" / "mine" / "model.safetensors").exists()
