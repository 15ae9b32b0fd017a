"""The command-line parsers of ``jaxhc data prepare``, ``generate``, ``eval`` and ``export``.

`add_parsers` adds them to `jaxhc.cli`'s subcommands; `COMMANDS` maps each to its function,
which takes the parsed arguments and returns the exit status.
"""

from __future__ import annotations

import shlex
import sys

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub) -> None:
    data = sub.add_parser("data", help="prepare a dataset: text in, tokenizer and token shards out")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser(
        "prepare", help="tokenize text files, folders, .jsonl and .gz into a dataset folder"
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files or folders of them")
    p.add_argument("--out", required=True, help="the dataset folder to write")
    p.add_argument(
        "--tokenizer",
        default="bytes",
        help="bytes (default: the UTF-8 bytes, 256 tokens), bpe:VOCAB (a byte-level BPE of "
        "VOCAB tokens trained on the input) or a tokenizer.json (or a folder holding one)",
    )
    p.add_argument("--field", default="text", help="the text field of .jsonl lines (default text)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="the share of the tokens held out for validation: the end of the last inputs "
        "(default 0.1)",
    )
    p.add_argument("--shard-tokens", type=int, help="tokens per shard file (default 2^27)")
    p.add_argument(
        "--bpe-sample-mb",
        type=float,
        default=512,
        help="bpe:VOCAB is trained on the first this many MB of text (default 512)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines")

    g = sub.add_parser("generate", help="continue a prompt with a trained run's model")
    _run_args(g)
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--max-new-tokens", type=int, default=200, help="tokens to add (default 200)")
    g.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature (default 0.8; 0: always the most likely token)",
    )
    g.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (0: all)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")

    e = sub.add_parser("eval", help="loss and perplexity of a run's model on a validation split")
    _run_args(e)
    e.add_argument(
        "--data", help="a prepared dataset with the run's tokenizer (default: the run's)"
    )
    e.add_argument(
        "--max-tokens", type=int, default=1 << 20, help="tokens to predict at most (default 2^20)"
    )

    x = sub.add_parser("export", help="write a run's model as a transformers GPT-2 or LLaMA folder")
    _run_args(x)
    x.add_argument("--hf", required=True, help="the folder to write (new or empty)")


def _run_args(p) -> None:
    p.add_argument("--run", required=True, help="a run directory written by jaxhc train")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")


def cmd_data(args) -> int:
    from jaxhc.data.prepare import DEFAULT_SHARD_TOKENS, mb_per_s, prepare

    meta = prepare(
        args.inputs,
        args.out,
        args.tokenizer,
        field=args.field,
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS,
        bpe_sample_mb=args.bpe_sample_mb,
        command=shlex.join(["jaxhc", *sys.argv[1:]]),
        progress=False if args.no_progress else None,
    )
    tokens = meta["tokens"]
    if meta["status"] == "up to date":
        print(f"{args.out} is up to date (prepared from the same input with the same options)")
        return 0
    print(
        f"wrote {args.out}: {meta['documents']} documents, {meta['input_bytes'] / 1e6:.1f} MB -> "
        f"{tokens['train']} training and {tokens['val']} validation tokens ({meta['dtype']}, "
        f"{meta['tokenizer']['vocab_size']}-token {meta['tokenizer']['spec']} tokenizer; "
        f"{mb_per_s(meta):.1f} MB/s)"
    )
    return 0


def cmd_generate(args) -> int:
    from jaxhc.workflow.generate import generate_text

    result = generate_text(
        args.run,
        args.prompt,
        args.max_new_tokens,
        step=args.step,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
    )
    print(args.prompt + result["text"])
    return 0


def cmd_eval(args) -> int:
    from jaxhc.workflow.evaluate import evaluate

    r = evaluate(args.run, args.data, step=args.step, max_tokens=args.max_tokens)
    print(
        f"{args.run} step {r['step']} on {r['data']} (validation, {r['tokens']} tokens): "
        f"loss {r['loss']:.4f} perplexity {r['perplexity']:.3f}"
    )
    return 0


def cmd_export(args) -> int:
    from jaxhc.workflow.export import export

    r = export(args.run, args.hf, step=args.step)
    print(f"wrote {args.hf} (step {r['step']}): {', '.join(r['files'])}")
    return 0


COMMANDS = {"data": cmd_data, "generate": cmd_generate, "eval": cmd_eval, "export": cmd_export}
