"""`make gpu-check DRY_RUN=1` (docs/gpu.md): the GPU check's script and its harness run on the CPU
with small sizes, and the one JSON they write holds every stage with sane values."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402 - bench/ is not a package


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    # The check's own CPU device count (4) instead of the 8 of tests/conftest.py.
    env["XLA_FLAGS"] = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")
    )
    env.update(
        DRY_RUN="1",
        GPU_CHECK_JSON=str(out),
        GPU_CHECK_MIB="1",
        GPU_CHECK_SECONDS="300",
        GPU_CHECK_MAKE_FLAGS="-n",  # `make -n setup`: the setup stage's make, printed, not run
    )
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # CI time: the dry run takes ~40 s; `make test-all` runs it
def test_every_stage_ran_and_passed(dry_run):
    assert dry_run["mode"] == "dry-run" and dry_run["ok"]
    assert list(dry_run["stages"]) == list(gpu_check.STAGES)
    for name, stage in dry_run["stages"].items():
        assert stage["status"] == "ok", f"{name}: {stage.get('tail', '')[-1500:]}"
        assert 0 < stage["seconds"] <= stage["limit_s"]
    for name in ("gpu_tests", "oracle_tests"):  # collected, not run: there is no GPU
        assert dry_run["stages"][name]["collected"] > 0


@pytest.mark.slow  # CI time: the dry run takes ~40 s; `make test-all` runs it
def test_codec_throughput_records(dry_run):
    result = dry_run["stages"]["codecs"]["result"]
    assert result["platform"] == "cpu" and result["mib"] == 1
    records = {(r["codec"], r["dtype"]): r for r in result["records"]}
    want = {(c, d) for c in (*gpu_check.CODECS, "copy") for d in gpu_check.DTYPES}
    assert set(records) == want
    for (codec, dtype), r in records.items():
        assert r["bytes"] == 2**20
        if codec == "copy":
            assert math.isfinite(r["gbps"]) and r["gbps"] > 0
            continue
        for op in ("encode", "decode"):
            assert math.isfinite(r[f"{op}_gbps"]) and r[f"{op}_gbps"] > 0, (codec, dtype, op)
            assert r[f"{op}_of_copy"] > 0
        assert "same_payload_as_cpu" not in r  # the CPU is not compared with itself
    # zfp at rate R keeps R bits a value: ratio 32/R of float32, 16/R of bfloat16.
    assert records["zfp:8", "float32"]["ratio"] == 4.0
    assert records["zfp:16", "bfloat16"]["ratio"] == 1.0
    assert 3.9 < records["q8", "float32"]["ratio"] < 4.0  # 8 bits and a float32 scale per 256
    assert records["zfp:8", "float32"]["target_gbps"] == 1000
    assert records["zfp:8", "float32"]["meets_target"] is None  # not measured on an H200


@pytest.mark.slow  # CI time: the dry run takes ~40 s; `make test-all` runs it
def test_collectives_against_lax(dry_run):
    result = dry_run["stages"]["collectives"]["result"]
    assert result["platform"] == "cpu" and result["devices"] == 4
    assert set(result["codecs"]) <= set(gpu_check.COLLECTIVE_CODECS)
    assert {c.split(":")[0] for c in result["codecs"]} == {"zfp", "q8", "mpc"}
    for where in ("one_device", "all_devices"):
        assert set(result[where]) == set(result["codecs"])
        for spec, rec in result[where].items():
            for name in ("psum", "all_gather"):
                assert rec[name]["within_bound"], (where, spec, name, rec[name])
                if where == "all_devices":  # 4 devices: the one-device emulation's 4 ranks
                    assert rec["same_as_one_device"], (spec, rec)
                if spec.startswith("mpc"):  # lossless: exactly lax's
                    assert rec[name]["max_abs_error"] == 0.0
                else:  # lossy: the codec did run
                    assert 0.0 < rec[name]["max_abs_error"] <= rec[name]["bound"]


def test_report_of_a_stage_that_timed_out(tmp_path):
    """A stage killed by its timeout is recorded as such, with its output tail; stages that never
    ran are named."""
    (tmp_path / "setup.meta").write_text("rc=124\nms=1500\nlimit=1\n")
    (tmp_path / "setup.log").write_text("x" * 5000 + "last words")
    out = tmp_path / "r.json"
    gpu_check.main(["report", "--work", str(tmp_path), "--out", str(out), "--seconds", "2"])
    doc = json.loads(out.read_text())
    setup = doc["stages"]["setup"]
    assert setup["status"] == "timeout" and setup["exit"] == 124 and setup["seconds"] == 1.5
    assert setup["tail"].endswith("last words") and len(setup["tail"]) == gpu_check.TAIL_CHARS
    assert doc["stages"]["codecs"] == {"status": "not run"} and not doc["ok"]


def test_report_fails_a_gpu_run_whose_tests_all_skipped(tmp_path):
    (tmp_path / "gpu_tests.meta").write_text("rc=0\nms=900\nlimit=120\n")
    (tmp_path / "gpu_tests.xml").write_text(
        '<testsuites><testsuite tests="2" failures="0" errors="0" skipped="2">'
        '<testcase classname="t" name="a"><skipped/></testcase>'
        '<testcase classname="t" name="b"><skipped/></testcase></testsuite></testsuites>'
    )
    for mode, status in (("gpu", "failed"), ("dry-run", "ok")):
        out = tmp_path / f"{mode}.json"
        gpu_check.main(["report", "--work", str(tmp_path), "--out", str(out), "--mode", mode])
        tests = json.loads(out.read_text())["stages"]["gpu_tests"]
        assert tests["status"] == status and tests["tests"]["skipped"] == 2
