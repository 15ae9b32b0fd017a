"""Reading the user documentation for tests/test_docs.py: its code blocks, its links, and the
numbers it quotes from result files (docs/benchmarks.md, "How the numbers in these pages are
checked", describes the two locator forms a link's title may hold)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# The pages a user reads (bench/results/README.md is checked for its links and index only).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"([^\"]*)\")?\)")
ROWS_MARK = re.compile(r"^<!-- rows: (\S+) -->[ \t]*$", re.M)
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?", re.I)
RUN_LANGS = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
TAGS = {"slow", "norun"}

# Project history a user page, help text or result file name must not carry: issue and pull
# request numbers, milestone names ("stop 19"), commit hashes.
HISTORY = [
    re.compile(r"\b(?:issue|pr|pull request)s? #?\d+", re.I),
    re.compile(r"\bstop[ _-]?\d+\b", re.I),
    re.compile(r"(?<![\w/.#-])#\d+\b"),
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
]


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the tags after it (``slow``, ``norun``), its code and
    the line it starts on."""

    page: Path
    lang: str
    tags: frozenset
    code: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page; a runnable language with an unknown tag is an error."""
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        info = m.group(1).split()
        lang, tags = (info[0].lower(), frozenset(info[1:])) if info else ("", frozenset())
        line = text.count("\n", 0, m.start()) + 1
        if lang in RUN_LANGS and not tags <= TAGS:
            raise ValueError(f"{page.name}:{line}: unknown fence tags {sorted(tags - TAGS)}")
        found.append(Block(page, RUN_LANGS.get(lang, lang), tags, m.group(2), line))
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks and inline code (where links are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> list[tuple[str, str, str | None]]:
    """(text, target, title) of every link and image outside code."""
    return [(m.group(1), m.group(2), m.group(3)) for m in LINK.finditer(prose(page))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _load(path: Path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix in (".yaml", ".yml"):
        return yaml.safe_load(text)
    raise ValueError(f"{path.name}: a $-locator needs a JSON, JSONL or YAML file")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _select(items: list, selector: str, where: str):
    if re.fullmatch(r"-?\d+", selector):
        return items[int(selector)]
    want = dict(part.split("=", 1) for part in selector.split(","))
    hits = [
        item
        for item in items
        if isinstance(item, dict) and all(str(item.get(k)) == v for k, v in want.items())
    ]
    if len(hits) != 1:
        raise ValueError(f"{where}: [{selector}] matches {len(hits)} items, not one")
    return hits[0]


def json_path(data, locator: str, where: str):
    """The value at a ``$.a.b[k=v][0].c`` path."""
    if not locator.startswith("$"):
        raise ValueError(f"{where}: a path locator starts with $")
    value = data
    for key, selector in re.findall(r"\.([^.\[]+)|\[([^\]]*)\]", locator[1:]):
        if key:
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"{where}: no key {key!r}")
            value = value[key]
        else:
            value = _select(value, selector, where)
    return value


def table_rows(text: str) -> list[list[str]]:
    """Every markdown table row of a text, as stripped cells (header rows included)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.strip().startswith("|") and not re.fullmatch(r"[|:\- ]+", line.strip())
    ]


def tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of a text: a header row then its body rows."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip().startswith("|"):
            current.append(line)
        elif current:
            found.append(table_rows("\n".join(current)))
            current = []
    return [t for t in found if t]


def result_text(path: Path, json_key: str | None = None) -> str:
    """A result file's markdown: the file itself, or for JSON the string at ``json_key`` (all of
    its strings when none is named)."""
    if path.suffix != ".json":
        return path.read_text()
    data = json.loads(path.read_text())
    if json_key is None:
        return "\n".join(_strings(data))
    return json_path(data, "$." + json_key, str(path.name))


def table_cell(path: Path, locator: str, where: str) -> str:
    """The cell a ``[PATH: ]COLUMN @ KEY, KEY`` locator names (exactly one must match)."""
    head, _, keys = locator.partition(" @ ")
    json_key, _, column = head.rpartition(": ")
    keys = [k.strip() for k in keys.split(",")]
    hits = []
    for table in tables(result_text(path, json_key or None)):
        header = table[0]
        if column not in header:
            continue
        col = header.index(column)
        hits += [row[col] for row in table[1:] if row[: len(keys)] == keys and col < len(row)]
    if len(set(hits)) != 1:  # the same cell in several tables (a summary and "every number")
        raise ValueError(f"{where}: {locator!r} matches {len(hits)} cells of {path.name}")
    return hits[0]


def _agrees(written: str, value) -> bool:
    """Whether a number as written equals ``value`` rounded to the digits it is written with."""
    m = re.fullmatch(r"([+-]?[\d,]*\d)(?:\.(\d+))?(?:e([+-]?\d+))?", written, re.I)
    if not m or isinstance(value, bool):
        return False
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False
    ulp = 10.0 ** (int(m.group(3) or 0) - len(m.group(2) or ""))
    number = float(written.replace(",", ""))
    return math.isfinite(value) and abs(number - value) <= ulp / 2 * (1 + 1e-9)


def check_number(page: Path, text: str, target: str, title: str) -> str | None:
    """None when a linked number agrees with its result file, else what is wrong."""
    where = f"{page.relative_to(ROOT)}: [{text}]({target})"
    path = (page.parent / target.split("#")[0]).resolve()
    # An optional unit factor at the end: "$.mean_s * 1000" (seconds quoted as ms).
    locator, op, factor = re.fullmatch(
        r"(.*?)(?: ([*/]) (\d+(?:\.\d+)?(?:e-?\d+)?))?", title
    ).groups()
    try:
        if locator.startswith("$"):
            value = json_path(_load(path), locator, where)
            if isinstance(value, str):
                return None if value == text.strip() else f"{where}: the file says {value!r}"
            candidates = [value]
        else:
            candidates = [
                float(n.replace(",", "")) for n in NUMBER.findall(table_cell(path, locator, where))
            ]
        if op:
            candidates = [c * float(factor) if op == "*" else c / float(factor) for c in candidates]
    except (ValueError, KeyError, IndexError, TypeError, OSError) as e:
        return f"{where}: {e}"
    written = text.strip().rstrip("x%").strip().lstrip("+")
    if any(_agrees(written, c) for c in candidates):
        return None
    return f"{where} {title!r}: the file says {candidates}"


def checked_tables(page: Path) -> list[tuple[Path, list[str], int]]:
    """(result file, the table's lines, line number) for each ``<!-- rows: FILE -->`` table."""
    text = page.read_text()
    found = []
    for m in ROWS_MARK.finditer(text):
        rest = text[m.end() :].lstrip("\n").splitlines()
        table = []
        for line in rest:
            if not line.startswith("|"):
                break
            table.append(line)
        found.append(
            ((page.parent / m.group(1)).resolve(), table, text.count("\n", 0, m.start()) + 1)
        )
    return found


def history(text: str) -> list[str]:
    """Project history found in a text (see HISTORY)."""
    return [m.group(0) for pattern in HISTORY for m in pattern.finditer(text)]
