"""First contact with the CLI: the README's command with no environment variables, a readable log
when output is not a terminal, and an explicit device count left as the user set it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxhc.launch import set_cpu_device_count
from jaxhc.train.progress import Progress
from tests.test_train import TINY

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "experiments" / "default.yaml"


def jaxhc_train(out: Path, log: Path, *args: str, **env: str) -> int:
    """`jaxhc train --config default.yaml` in a fresh process, stdout and stderr into `log`."""
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    clean.update(JAX_PLATFORMS="cpu", **env)
    cmd = [sys.executable, "-m", "jaxhc.cli", "train", "--config", str(CONFIG), "--out", str(out)]
    with open(log, "w") as f:
        return subprocess.run(
            cmd + list(args), stdout=f, stderr=subprocess.STDOUT, env=clean, cwd=ROOT, timeout=300
        ).returncode


def test_readme_command_runs_without_xla_flags_and_logs_plain_lines(tmp_path):
    log = tmp_path / "log"
    rc = jaxhc_train(tmp_path / "run", log, "--steps", "3", "--log-every", "2", *TINY)
    text = log.read_text()
    assert rc == 0, text
    assert "\x1b" not in text and "\r" not in text, repr(text)  # no repaints in a redirected log
    steps = [line.split()[1] for line in text.splitlines() if line.startswith("step ")]
    assert steps == ["1/3", "2/3", "3/3"], text  # the first, every 2nd, the last
    assert "val " in text.splitlines()[1] and "wire MB/step data=" in text


def test_an_explicit_device_count_is_respected(tmp_path):
    log = tmp_path / "log"
    flags = "--xla_force_host_platform_device_count=2"
    assert jaxhc_train(tmp_path / "run", log, "--steps", "1", *TINY, XLA_FLAGS=flags) == 2
    assert "does not match the 2 devices" in log.read_text()


@pytest.mark.parametrize(
    "env",
    [
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"},
        {"JAX_NUM_CPU_DEVICES": "3"},
        {"JAX_PLATFORMS": "cuda"},
    ],
)
def test_a_user_choice_leaves_the_device_count_alone(env):
    before = dict(env)
    assert set_cpu_device_count(8, env) is False
    assert env == before


def test_device_count_is_not_changed_once_jax_started():
    import jax

    jax.devices()
    assert set_cpu_device_count(3, {}) is False


def record(step: int, **extra) -> dict:
    wire = {"data": 2e6, "loss": 8.0}
    return {"step": step, "loss": 1.5, "tokens_per_s": 100.0, "wire_bytes": wire, **extra}


def test_plain_lines_every_n_steps_without_a_terminal(capsys):
    with Progress(log_every=3).reporter(total=7, start=0, eval_every=50) as bar:
        for step in range(7):
            bar.update(record(step, **({"val_loss": 1.25} if step == 5 else {})))
        bar.note("checkpoint skipped")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ["1/7", "3/7", "6/7", "7/7"], out
    assert "wire MB/step data=2.00  val 1.2500" in lines[2] and "loss=" not in out
    assert lines[-1] == "checkpoint skipped" and "\x1b" not in out


def test_a_live_bar_only_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert type(Progress().reporter(3, 0, 1)).__name__ == "_Lines"  # pytest captures: no tty
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(sys, "stderr", Tty())
    assert type(Progress().reporter(3, 0, 1)).__name__ == "_Bar"
    assert type(Progress(enabled=False).reporter(3, 0, 1)).__name__ == "Reporter"
    with pytest.raises(ValueError, match="log_every=0 must be >= 1"):
        Progress(log_every=0)


def test_devices_per_process_follow_the_transport():
    from jaxhc.launch import ProcessEnv, host_devices
    from jaxhc.train.config import load

    mpirun = ProcessEnv.from_env({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "3"})
    single = ProcessEnv.from_env({})
    assert host_devices(load(str(CONFIG)), single) == 8  # the whole 2 x 2 x 2 mesh here
    assert host_devices(load(str(CONFIG), ["transport=mpi"]), mpirun) == 1
    assert host_devices(load(str(CONFIG)), mpirun) == 1  # jax.distributed: 8 processes x 1
    slurm = ProcessEnv.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    assert host_devices(load(str(CONFIG)), slurm) == 4
    with pytest.raises(ValueError, match="mesh size 8 is not a multiple of the 3 processes"):
        host_devices(load(str(CONFIG)), ProcessEnv.from_env({"JAXHC_NUM_PROCESSES": "3"}))


def test_compression_help_lists_every_shipped_preset(capsys):
    """The presets on disk (configs/policy) are the ones `--compression` offers by name."""
    from jaxhc import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    shipped = sorted(p.stem for p in (ROOT / "configs" / "policy").glob("*.yaml"))
    listed = help_text.split("policy preset (")[1].split(")")[0].split(", ")
    assert sorted(listed) == shipped
