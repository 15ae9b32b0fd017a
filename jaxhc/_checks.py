"""Argument checks shared across jaxhc: one-line errors that name the culprit."""

from __future__ import annotations


def split_dim(x, dim: int, tiled: bool, parts: int, where: str, name: str = "dimension") -> int:
    """Normalize `dim` of `x` that a collective splits into `parts` (equal to it unless tiled)."""
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{where}: {name} {dim} out of range for shape {x.shape}")
    dim %= x.ndim
    size = x.shape[dim]
    if (tiled and size % parts) or (not tiled and size != parts):
        need = f"a multiple of {parts}" if tiled else f"equal to the axis size {parts}"
        raise ValueError(f"{where}: dimension {dim} of shape {x.shape} must be {need}")
    return dim


def whole_number(key: str, value, least: int = 1) -> None:
    """`value` (of config key `key`) must be an int, not a bool, and at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        need = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"{key}={value!r} must be {need}")


def read_yaml(path):
    """The YAML document in the file `path`; a syntax error or undecodable bytes are one
    ValueError line naming the file (and line:column)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return yaml_value(text, str(path), marks=True)


def read_json(path, missing: str):
    """The JSON document in the file `path`; `missing` is the error when there is no such file.
    An unreadable file or invalid JSON is one ValueError line naming the file."""
    import json

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ValueError(missing) from None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def yaml_value(text: str, where: str, marks: bool = False):
    """`text` read as YAML; a syntax error is one ValueError line starting with `where` (with
    the error's line:column when `marks`)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None and marks:
            where = f"{where}:{mark.line + 1}:{mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise ValueError(f"{where}: not valid YAML ({problem})") from None
