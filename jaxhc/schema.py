"""One strict loader for every YAML jaxhc reads: a mapping checked against a dataclass; and
the readers of its YAML and JSON files (`read_yaml`, `read_json`), whose errors name the file.

The dataclasses are the schema: their fields name the keys, their annotations the types, their
``__post_init__`` the ranges and the rules between keys. `structure` builds one from a mapping
(what YAML or the command line gave) with `cattrs`, strictly: an unknown key, a missing key or a
value of the wrong type is a `ValueError` of one line naming the key, as is a `__post_init__`
error (its message kept as it is). No value is coerced but for numbers where a float is expected
(YAML 1.1 reads ``1e-3`` as a string: numeric strings are accepted there).

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Link:
...     gbit_s: float
...     latency_us: float = 0.0
>>> structure(Link, {"gbit_s": 100})
Link(gbit_s=100.0, latency_us=0.0)
>>> structure(Link, {"gbit_s": 1, "latncy_us": 2}, kind="cluster", prefix="links.intra")
Traceback (most recent call last):
ValueError: unknown cluster key 'links.intra.latncy_us'
>>> structure(Link, {"gbit_s": True}, where="a.yaml")
Traceback (most recent call last):
ValueError: a.yaml: gbit_s=True must be a number
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["Invalid", "merged", "read_json", "read_yaml", "structure", "yaml_value"]

T = TypeVar("T")


class Invalid(ValueError):
    """A value out of range, raised by a schema dataclass's ``__post_init__`` with the key
    relative to the dataclass: `structure` names the whole dotted key.

    >>> from jaxhc.schema import Invalid
    >>> str(Invalid("gbit_s", 0, "> 0"))
    'gbit_s=0 must be > 0'
    """

    def __init__(self, key: str, value, need: str):
        super().__init__(f"{key}={value!r} must be {need}")
        self.key, self.value, self.need = key, value, need


class _Wrong(TypeError):
    """A value of the wrong type: `expected` says what the key takes."""

    def __init__(self, expected: str, value):
        super().__init__(expected)
        self.expected, self.value = expected, value


def _int(value, _):
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Wrong("an integer", value)
    return value


def _float(value, _):
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            raise _Wrong("a number", value) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Wrong("a number", value)
    return float(value)


def _bool(value, _):
    if not isinstance(value, bool):
        raise _Wrong("true or false", value)
    return value


def _str(value, _):
    if not isinstance(value, str):
        raise _Wrong("a string", value)
    return value


def _checked(make, kind: str):
    """A cattrs hook factory: `make`'s hook, after a check that the value is a `kind`."""

    def factory(cls, conv):
        inner = make(cls, conv)

        def hook(value, _):
            want = Mapping if kind == "mapping" else (list, tuple)
            if not isinstance(value, want):
                raise _Wrong(f"a {kind}", value)
            return inner(value, cls)

        return hook

    return factory


def _name_or_mapping(t) -> bool:
    """``str | C`` where C has ``from_dict``: a name, a C, or a mapping C.from_dict reads."""
    args = typing.get_args(t)
    return (
        isinstance(t, types.UnionType)
        and len(args) == 2
        and args[0] is str
        and hasattr(args[1], "from_dict")
    )


def _name_or_mapping_hook(t):
    cls = typing.get_args(t)[1]

    def hook(value, _):
        if isinstance(value, (str, cls)):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise _Wrong("a name or a mapping", value)

    return hook


@functools.cache
def _converter():
    import cattrs
    from cattrs import cols
    from cattrs.gen import make_dict_structure_fn

    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for typ, hook in ((int, _int), (float, _float), (bool, _bool), (str, _str)):
        conv.register_structure_hook(typ, hook)
    conv.register_structure_hook(Any, lambda value, _: value)
    conv.register_structure_hook_factory(_name_or_mapping, _name_or_mapping_hook)
    conv.register_structure_hook_factory(
        lambda t: dataclasses.is_dataclass(t) and isinstance(t, type),
        _checked(
            lambda cls, c: make_dict_structure_fn(cls, c, _cattrs_forbid_extra_keys=True), "mapping"
        ),
    )
    conv.register_structure_hook_factory(
        cols.is_mapping, _checked(cols.mapping_structure_factory, "mapping")
    )
    conv.register_structure_hook_factory(
        lambda t: typing.get_origin(t) is list, _checked(cols.list_structure_factory, "list")
    )
    conv.register_structure_hook_factory(
        lambda t: typing.get_origin(t) is tuple,
        _checked(cols.homogenous_tuple_structure_factory, "list"),
    )
    return conv


def merged(base, data: Mapping) -> dict:
    """`data` over the fields of dataclass `base` (as plain values): a key of `data` replaces
    the base's value, a mapping given for a dataclass-valued field merges into it.

    >>> import dataclasses
    >>> from jaxhc.schema import merged
    >>> @dataclasses.dataclass(frozen=True)
    ... class Inner:
    ...     a: int = 1
    ...     b: int = 2
    >>> @dataclasses.dataclass(frozen=True)
    ... class Outer:
    ...     inner: Inner = Inner()
    ...     c: int = 3
    >>> merged(Outer(), {"inner": {"b": 5}})
    {'inner': {'a': 1, 'b': 5}, 'c': 3}
    """
    out = {f.name: _plain(getattr(base, f.name)) for f in dataclasses.fields(base)}
    for key, value in data.items():
        below = getattr(base, key, None) if isinstance(key, str) and key in out else None
        if dataclasses.is_dataclass(below) and isinstance(value, Mapping):
            out[key] = merged(below, value)
        else:
            out[key] = value
    return out


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def structure(
    cls: type[T],
    data: Any,
    *,
    kind: str | None = "config",
    prefix: str = "",
    where: str | None = None,
    base: T | None = None,
    checks: str | None = None,
) -> T:
    """`data` as dataclass `cls`; a bad key or value is one `ValueError` line naming it.

    `kind` names the file's keys in messages (``unknown cluster key 'x'``; None: ``unknown key
    'x'``), `prefix` is the dotted key above `data` (``mesh.shard``), `where` starts every message
    (a file name). With `base` (an instance of `cls`) the keys `data` leaves out keep the base's
    values, nested dataclasses merged key by key (`merged`). `checks` (default: `where`) starts
    the messages of the dataclasses' own ``__post_init__`` errors instead.

    >>> from jaxhc.model import MeshConfig
    >>> from jaxhc.schema import structure
    >>> structure(MeshConfig, {"tensor": 4, "shard": {"optim": 2}}, base=MeshConfig(data=2)).shape
    (2, 4, 1)
    >>> structure(MeshConfig, {"shard": {"optimizer": 2}}, prefix="mesh")
    Traceback (most recent call last):
    ValueError: unknown config key 'mesh.shard.optimizer'
    """
    path = tuple(prefix.split(".")) if prefix else ()
    given = data
    try:
        if not isinstance(data, Mapping):
            raise _Wrong("a mapping", data)
        if base is not None:
            data = merged(base, data)
        return _converter().structure(data, cls)
    except Exception as e:
        # The error of the key the input gives first (cattrs reports in field order).
        path_, error = min(_leaves(e, path), key=lambda pe: _order(given, pe[0][len(path) :]))
        message = _message(error, path_, kind)
        if message is None:
            raise
        own = type(error) is ValueError and checks is not None
        start = checks if own else where
        raise ValueError(f"{start}: {message}" if start else message) from None


def _leaves(error: BaseException, path: tuple):
    """The leaf errors of a cattrs exception group, each with the key path down to it."""
    from cattrs.errors import AttributeValidationNote, IterableValidationNote

    for note in getattr(error, "__notes__", ()):
        if isinstance(note, AttributeValidationNote):
            path = (*path, note.name)
        elif isinstance(note, IterableValidationNote):
            path = (*path, note.index)
    subs = getattr(error, "exceptions", None)  # an exception group (a backport's on 3.10)
    if subs:
        for sub in subs:
            yield from _leaves(sub, path)
    else:
        yield path, error


def _order(data, path: tuple) -> tuple:
    """Where the key `path` comes in `data` (keys in the order given; absent ones last)."""
    out = []
    for key in path:
        keys = list(data) if isinstance(data, Mapping) else []
        if key not in keys:
            out.append(len(keys))
            break
        out.append(keys.index(key))
        data = data[key]
    return tuple(out)


def _message(error: BaseException, path: tuple, kind: str | None) -> str | None:
    from cattrs.errors import ForbiddenExtraKeysError

    key = ".".join(map(str, path))
    keys = f"{kind} key" if kind else "key"
    if isinstance(error, ForbiddenExtraKeysError):
        extra = sorted(error.extra_fields, key=str)[0]
        return f"unknown {keys} '{'.'.join(map(str, (*path, extra)))}'"
    if isinstance(error, KeyError) and error.args:
        return f"{keys} '{key}' is missing"
    if isinstance(error, _Wrong):
        if error.expected in ("a mapping", "a list"):
            whole = f"expected {error.expected} of {keys}s"
            if not key:
                return f"{whole}, got {type(error.value).__name__}"
            return f"'{key}' must be {error.expected}, got {error.value!r}"
        return f"{key}={error.value!r} must be {error.expected}"
    if isinstance(error, Invalid):
        return f"{'.'.join(map(str, (*path, error.key)))}={error.value!r} must be {error.need}"
    if isinstance(error, ValueError):
        return str(error)
    return None


def read_yaml(path):
    """The YAML document in the file `path`; a syntax error or undecodable bytes are one
    ValueError line naming the file (and line:column).

    >>> import os, tempfile
    >>> from jaxhc.schema import read_yaml
    >>> with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    ...     _ = f.write("mesh: {data: 2")
    >>> read_yaml(f.name)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ....yaml:1:15: not valid YAML (...)
    >>> os.remove(f.name)
    """
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return yaml_value(text, str(path), marks=True)


def yaml_value(text: str, where: str, marks: bool = False):
    """`text` read as YAML; a syntax error is one ValueError line starting with `where` (with
    the error's line:column when `marks`).

    >>> from jaxhc.schema import yaml_value
    >>> yaml_value("data: 2", "--mesh")
    {'data': 2}
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None and marks:
            where = f"{where}:{mark.line + 1}:{mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise ValueError(f"{where}: not valid YAML ({problem})") from None


def read_json(path, missing: str):
    """The JSON document in the file `path` (a run's config, a dataset's metadata, a Hugging
    Face config); `missing` is the error when there is no such file. An
    unreadable file or invalid JSON is one ValueError line naming the file.

    >>> import os, tempfile
    >>> from jaxhc.schema import read_json
    >>> read_json("/nonexistent/config.json", "--run /nonexistent: no config.json")
    Traceback (most recent call last):
    ValueError: --run /nonexistent: no config.json
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     _ = f.write('{"model": ')
    >>> read_json(f.name, "missing")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ....json: not valid JSON (Expecting value: line 1 column 11 (char 10))
    >>> os.remove(f.name)
    """
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
