"""The command-line parsers of the workflow around training: ``jaxhc data prepare``.

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


COMMANDS = {"data": cmd_data}
