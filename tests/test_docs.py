"""The user documentation: its code blocks run as written, every number it quotes from a result
file agrees with that file, its links resolve, and it carries no project history."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _docs import (
    PAGES,
    RESULTS,
    ROOT,
    anchors,
    blocks,
    check_number,
    checked_tables,
    history,
    links,
    result_text,
    table_rows,
)

QUICKSTART = ROOT / "docs" / "quickstart.md"
README_MAX_LINES = 200


def _env() -> dict:
    """A user's environment: this venv first on PATH, no test-only variables and no XLA_FLAGS
    (jaxhc's commands size the CPU backend themselves)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST", "JAX_COMPILATION", "XLA_FLAGS"))
    }
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    return env


def _workdir(tmp_path: Path) -> Path:
    """A fresh folder that sees the repository's configs and bench (commands name them)."""
    for name in ("configs", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _runs(page: Path, slow: bool) -> dict[str, list]:
    """The page's blocks a quick (or slow) run executes, per language, in page order: a slow run
    takes the quick blocks too (later blocks may use what earlier ones made)."""
    chosen = {"python": [], "bash": []}
    for block in blocks(page):
        if block.lang in chosen and "norun" not in block.tags and ("slow" in block.tags) <= slow:
            chosen[block.lang].append(block)
    return chosen


def _cases(slow: bool):
    for page in PAGES:
        if page == QUICKSTART:  # its own test below, with checks of what it made
            continue
        for lang, chosen in _runs(page, slow).items():
            if chosen and (not slow or any("slow" in b.tags for b in chosen)):
                yield pytest.param(page, lang, id=f"{page.name}-{lang}")


def _run(page: Path, lang: str, slow: bool, tmp_path: Path) -> None:
    chosen = _runs(page, slow)[lang]
    cwd, env = _workdir(tmp_path), _env()
    if lang == "python":  # one process per page: later blocks use earlier blocks' names
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        script = "\n".join(f"# {b.where}\n{b.code}" for b in chosen)
        runs = [(chosen[0].where, [sys.executable, "-c", script])]
    else:
        runs = [(b.where, ["bash", "-e", "-o", "pipefail", "-c", b.code]) for b in chosen]
    for where, argv in runs:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"{where}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize(("page", "lang"), list(_cases(slow=False)))
def test_quick_blocks_run(page, lang, tmp_path):
    """Every untagged python and bash block of README.md and docs/ runs as written."""
    _run(page, lang, False, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("page", "lang"), list(_cases(slow=True)))
def test_slow_blocks_run(page, lang, tmp_path):
    """The blocks tagged ``slow`` (training runs), after the page's quick ones."""
    _run(page, lang, True, tmp_path)


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    """docs/quickstart.md's shell blocks after the setup one, in order, in a fresh folder, with
    this environment's jaxhc and python first on PATH and no XLA_FLAGS (as a user runs them)."""
    chosen = _runs(QUICKSTART, slow=True)["bash"]
    assert blocks(QUICKSTART)[0].code.startswith("make setup")
    env = _env()
    for block in chosen:
        done = subprocess.run(
            ["bash", "-e", "-c", block.code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, f"{block.where}\n{done.stdout}\n{done.stderr}"
    meta = json.loads((tmp_path / "data" / "mine" / "meta.json").read_text())
    assert meta["tokenizer"]["spec"] == "bpe:4096"
    for run, steps in (("mine", 200), ("mine-more", 20)):
        assert len((tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()) == steps
    assert (tmp_path / "exported" / "mine" / "model.safetensors").exists()


# What keeps a block from running here: root, MPI across hosts, a GPU, a setup step, a long
# benchmark, or a folder a user names.
NORUN_REASONS = re.compile(
    r"sudo|mpirun|srun|make |pip install|jaxhc sweep|bench[./]|/shared/|\"OUT\""
)


def test_blocks_that_do_not_run_say_why():
    """A shell or python block is run (quick or slow) unless it needs what this machine lacks."""
    unexplained = [
        b.where
        for p in PAGES
        for b in blocks(p)
        if b.lang in ("python", "bash") and "norun" in b.tags and not NORUN_REASONS.search(b.code)
    ]
    assert not unexplained, unexplained


def test_quoted_numbers_agree_with_their_result_files():
    """A number linked to a file under bench/results names its place in the file (the link's
    title) and equals the value there, rounded as written."""
    problems, checked = [], 0
    for page in PAGES:
        for text, target, title in links(page):
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(RESULTS) or not re.search(r"\d", text):
                continue
            if re.search(r"\.(json|jsonl|md|yaml|png)$|/$", text):  # a file name, not a number
                continue
            if not title:
                problems.append(f"{page.name}: [{text}]({target}) has no locator title")
                continue
            checked += 1
            problem = check_number(page, text, target, title)
            if problem:
                problems.append(problem)
    assert not problems, "\n".join(problems)
    assert checked >= 30


def test_copied_tables_are_rows_of_their_result_files():
    """Each table after ``<!-- rows: FILE -->`` holds rows of FILE, header included."""
    problems, checked = [], 0
    for page in PAGES:
        for path, table, line in checked_tables(page):
            assert table, f"{page.name}:{line}: no table after the rows marker"
            have = {tuple(row) for row in table_rows(result_text(path))}
            for row in table_rows("\n".join(table)):
                checked += 1
                if tuple(row) not in have:
                    problems.append(f"{page.name}:{line}: not a row of {path.name}: {row}")
    assert not problems, "\n".join(problems)
    assert checked >= 50


def test_relative_links_resolve():
    """Every relative link (README, docs, the results index) names a file or folder that exists,
    and a #fragment into a markdown page names one of its headings."""
    problems = []
    for page in [*PAGES, RESULTS / "README.md", ROOT / "CHANGELOG.md"]:
        for _, target, _ in links(page):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                problems.append(f"{page.relative_to(ROOT)}: {target} does not exist")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                problems.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


@functools.cache
def _help_texts() -> dict[str, str]:
    """`jaxhc --help` and every subcommand's, as a user sees them (200 columns wide)."""
    from jaxhc import cli

    def show(*argv) -> str:
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
            mp.setenv("COLUMNS", "200")
            with pytest.raises(SystemExit):
                cli.main([*argv, "--help"])
        return out.getvalue()

    top = show()
    commands = re.search(r"\{([a-z,]+)\}", top).group(1).split(",")
    texts = {"jaxhc": top, **{c: show(c) for c in commands}}
    texts["data prepare"] = show("data", "prepare")
    return texts


def test_no_project_history_in_user_docs_help_or_result_names():
    """README, docs, help texts and result file names carry no issue numbers, milestone names
    ("stop N") or commit hashes: history belongs in commit messages and CHANGELOG.md."""
    found = {str(p.relative_to(ROOT)): history(p.read_text()) for p in PAGES}
    found |= {f"jaxhc {name} --help": history(text) for name, text in _help_texts().items()}
    found["bench/results"] = history(" ".join(p.name for p in RESULTS.rglob("*")))
    found = {where: hits for where, hits in found.items() if hits}
    assert not found, found


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_every_result_file_is_indexed():
    """bench/results/README.md links every file and folder of bench/results."""
    index = RESULTS / "README.md"
    targets = {t.split("#")[0].rstrip("/") for _, t, _ in links(index)}
    missing = [
        p.name
        for p in sorted(RESULTS.iterdir())
        if p != index and not any(t == p.name or t.startswith(p.name + "/") for t in targets)
    ]
    assert not missing, f"not in bench/results/README.md: {missing}"


def test_train_help_lists_every_preset_and_codec_family():
    """`jaxhc train --help` names every shipped preset and every codec spec form the parser
    takes, both lists read from the code."""
    from jaxhc.codecs import SPEC_FORMS, parse
    from jaxhc.policy import PRESETS

    text = " ".join(_help_texts()["train"].split())
    missing = [name for name in [*PRESETS, *SPEC_FORMS.values()] if name not in text]
    assert not missing, missing
    assert sorted(PRESETS) == sorted(p.stem for p in (ROOT / "configs" / "policy").glob("*.yaml"))
    for family in SPEC_FORMS:  # each family is one the parser takes
        example = {"zfp": "zfp:8", "mpc": "mpc:0.8"}.get(family, family)
        assert parse(example) is not None
    with pytest.raises(ValueError, match=re.escape(SPEC_FORMS["q4"])):
        parse("zfq:8")


def test_policies_page_lists_every_preset():
    from jaxhc.policy import PRESETS

    text = (ROOT / "docs" / "policies.md").read_text()
    assert not [name for name in PRESETS if f"| `{name}` |" not in text]


def _fields(cls, prefix: str) -> dict:
    """Every config key under a dataclass, dotted, with its default as a YAML user writes it."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default
        if dataclasses.is_dataclass(default):
            out |= _fields(type(default), f"{prefix}{f.name}.")
        else:
            out[prefix + f.name] = default
    return out


def test_the_config_reference_matches_the_config_classes():
    """docs/training.md's config reference lists every key of the config dataclasses
    (jaxhc/train/config.py, jaxhc/model/config.py) with its default."""
    from jaxhc.train.config import DataConfig, ExperimentConfig

    want = {}
    for f in dataclasses.fields(ExperimentConfig):
        if f.name == "data":
            want |= _fields(DataConfig, "data.")
        elif dataclasses.is_dataclass(f.default):
            want |= _fields(type(f.default), f"{f.name}.")
        else:
            want[f.name] = f.default
    text = (ROOT / "docs" / "training.md").read_text()
    documented = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([a-z0-9_.]+)` \| ([^|]*) \|", text, re.M)
    }

    def shown(value) -> str:
        if value is None:
            return "unset"
        if value == "":
            return "(required)"
        if isinstance(value, bool):
            return str(value).lower()
        return str(value)

    assert sorted(documented) == sorted(want)
    wrong = {
        key: (documented[key], shown(default))
        for key, default in want.items()
        if default is not dataclasses.MISSING and documented[key] != shown(default)
    }
    assert not wrong, wrong
