"""Training on a prepared dataset (the ``data:`` section): the vocabulary follows the tokenizer,
damaged shards stop the run before it starts, and a resumed run continues bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxhc import cli
from jaxhc.data import Dataset
from jaxhc.data.prepare import prepare
from jaxhc.train.config import load
from tests.test_data import SAMPLE
from tests.test_train import TINY, losses


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "a.txt").write_text(SAMPLE * 3)
    out = root / "ds"
    prepare([str(root / "a.txt")], str(out), "bpe:300", shard_tokens=2000, progress=False)
    return out


def train(out, data, *args) -> int:
    args = ["--out", str(out), "--no-progress", *TINY, f"data.path={data}", *args]
    return cli.main(["train", *args])


def test_the_vocabulary_follows_the_tokenizer(dataset):
    assert load(None, [f"data.path={dataset}"]).model.vocab_size == 300
    assert load(None, [f"data.path={dataset}", "model.vocab_size=320"]).model.vocab_size == 320
    bad = [
        (["model.vocab_size=256"], "model.vocab_size=256 is smaller than the 300 tokens of data"),
        (["data.checksum=maybe"], "data.checksum='maybe' must be true or false"),
        (["data.shards=2"], "unknown config key 'data.shards'"),
    ]
    for overrides, message in bad:
        with pytest.raises(ValueError, match=message):
            load(None, [f"data.path={dataset}", *overrides])
    with pytest.raises(ValueError, match="data.path='nowhere': no such folder"):
        load(None, ["data.path=nowhere"])
    with pytest.raises(ValueError, match="is not a prepared dataset: it has no meta.json"):
        load(None, [f"data.path={dataset.parent}"])


def test_batches_depend_on_seed_and_step_only(dataset):
    a = Dataset.open(str(dataset)).batches(8, 16, 5)
    late = a.train(7)
    b = Dataset.open(str(dataset), checksum=False).batches(8, 16, 5)
    for step in (0, 7, 3):
        np.testing.assert_array_equal(b.train(step), a.train(step))
    np.testing.assert_array_equal(late, b.train(7))
    assert late.dtype == np.int32 and late.shape == (8, 17) and late.max() < 300


def test_a_damaged_shard_stops_the_run_in_one_line(dataset, tmp_path, capsys):
    copy = tmp_path / "ds"
    copy.mkdir()
    for f in dataset.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    shard = copy / "train-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    assert train(tmp_path / "run", copy, "--steps", "1") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"jaxhc train: error: dataset shard {shard} is truncated: 3996 bytes, 4000 in meta.json"
    )


@pytest.mark.slow
def test_resume_on_a_prepared_dataset_is_bit_exact(dataset, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    common = ["optim.total_steps=4", "data.checksum=false"]
    assert train(full, dataset, "train.steps=4", *common) == 0
    assert train(part, dataset, "train.steps=2", *common) == 0
    assert train(part, dataset, "train.steps=4", "--resume", *common) == 0
    assert losses(part) == losses(full)  # bit-identical floats, steps 0..3
    config = json.loads((full / "config.json").read_text())
    assert config["model"]["vocab_size"] == 300 and config["data"]["path"] == str(dataset)
    assert (full / "tokenizer.json").read_text() == (dataset / "tokenizer.json").read_text()
