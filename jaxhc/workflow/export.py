"""`jaxhc export`: a run's checkpoint as a transformers GPT-2 or LLaMA folder, with its tokenizer.

The folder loads with ``GPT2LMHeadModel.from_pretrained`` (and ``FlaxGPT2LMHeadModel``; a LLaMA
run's with ``LlamaForCausalLM`` and ``FlaxLlamaForCausalLM``) and its
tokenizer with ``AutoTokenizer.from_pretrained`` (a `PreTrainedTokenizerFast` over the run's
tokenizer.json; the bytes tokenizer too, mapping text to the same byte ids).
"""

from __future__ import annotations

import json
import os

from jaxhc.data.tokenizer import END_OF_TEXT
from jaxhc.model.hf_io import save_pretrained
from jaxhc.workflow.run import Run

__all__ = ["export"]


def export(run_dir: str, out: str, *, step: int | None = None) -> dict:
    """Write checkpoint `step` (default: the latest) of the run as the folder `out` (which must
    not exist yet, or be empty). Returns ``{"step", "files"}``."""
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--hf {out} already exists and is not an empty folder")
    run = Run(run_dir)
    tokenizer = run.tokenizer()
    step, params = run.params(step)
    save_pretrained(out, run.model, params, eos_id=tokenizer.eos_id)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    special = (
        {}
        if tokenizer.eos_id is None
        else {
            "bos_token": END_OF_TEXT,
            "eos_token": END_OF_TEXT,
            "unk_token": END_OF_TEXT,
        }
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": run.model.block_size,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    for name, value in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        with open(os.path.join(out, name), "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")
    return {"step": step, "files": sorted(os.listdir(out))}
