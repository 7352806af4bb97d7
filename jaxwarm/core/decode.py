"""The one reader of typed values: YAML or JSON data into the annotated dataclasses.

It reads every section of the config, a step factory's own arguments (`jaxwarm.step.
step_args`) and jaxwarm's JSON files (manifest entries, bundle metadata, the submitted-jobs
list). Types come from the annotations, and what a schema says beyond a type it says as
`Annotated` metadata the reader knows: `Bound` (a number's range), `NumbersAsText` (a
string a number may be written for), `CommandLine` (a list of arguments no shell splits);
`Literal[...]` names the values a field takes. The schema knows nothing else of reading;
the reader knows no key by name. Two rules hold for every value: a number is finite, and a
string has no control character (strings reach job scripts, `#SBATCH` lines and the
environment, where a newline starts a new command). Every problem is one ConfigError naming
the file, the dotted key and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from jaxwarm.core.errors import ConfigError


@dataclass(frozen=True)
class Bound:
    """The range a number field takes (NaN and infinity never pass the reader): from
    `low`, and up to `high` where a larger value passes parsing only to break later (a
    meeting's timeout in a barrier's integer milliseconds, a requeue signal sbatch refuses);
    `high_means` says what that maximum is, in the one line."""

    low: float
    inclusive: bool = True
    high: float | None = None
    high_means: str = ""

    def problem(self, value: float) -> str | None:
        kind = "integer" if isinstance(value, int) else "number"
        if self.high is not None and value > self.high:
            means = f" ({self.high_means})" if self.high_means else ""
            return f"expected at most {self.high:g}{means}, got {value:g}"
        if value > self.low or (self.inclusive and value == self.low):
            return None
        if self.low == 0 and not self.inclusive:
            return f"expected a positive {kind}, got {value}"
        return f"expected {'an' if kind == 'integer' else 'a'} {kind} " \
               f"{'>=' if self.inclusive else '>'} {self.low:g}, got {value}"


@dataclass(frozen=True)
class NumbersAsText:
    """A string a number may be written for, and is read as its text: YAML reads an
    environment variable's `OMP_NUM_THREADS: 4` or an sbatch option's `nodes: 2` as a
    number, where the value is the string "4"."""


@dataclass(frozen=True)
class CommandLine:
    """A list of arguments run without a shell: a string given for it is refused with that
    reason, not split."""


# The metadata key of a dataclass field the data never gives: `field(metadata={UNREAD:
# True})` (the config's `source`, where it was read from, set by the caller).
UNREAD = "jaxwarm.unread"
# C0 and C1 controls (NEL among them), Unicode line and paragraph separators, and the bidi
# marks, embeddings, overrides and isolates (RLO makes a line display other than it reads).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")


def convert(tp: Any, value: Any, key: str, source: str) -> Any:
    """Convert a YAML or JSON value to the annotated type, or raise a ConfigError naming
    `source` and `key` (`convert(ModelArgs, config.step.args, "step.args", config.source)`)."""
    where = key or "<top level>"

    def fail(problem: str) -> typing.NoReturn:
        raise ConfigError(f"{source}: {where}: {problem}")

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        base, *metadata = args
        if _is_number(value) and any(isinstance(m, NumbersAsText) for m in metadata):
            value = str(value)
        if isinstance(value, str) and any(isinstance(m, CommandLine) for m in metadata):
            fail("expected a list of arguments (e.g. [jaxwarm-train, --flag]), got a string; "
                 "no shell is used to split it")
        result = convert(base, value, key, source)
        for bound in metadata:
            if isinstance(bound, Bound) and result is not None and \
                    (problem := bound.problem(result)):
                fail(problem)
        return result
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, key, source)
    if origin is Literal:
        if isinstance(value, str):
            convert(str, value, key, source)  # the single-line rule first, as for any string
        if any(type(value) is type(choice) and value == choice for choice in args):
            return value
        got = repr(value) if isinstance(value, str) else _describe(value)
        fail(f"expected one of {', '.join(_spelled(choice) for choice in args)}, got {got}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        errors = []
        for member in members:
            try:
                return convert(member, value, key, source)
            except ConfigError as exc:
                errors.append(exc)
        if len(members) == 1:
            raise errors[0]
        for member, error in zip(members, errors, strict=True):
            if type(value) in _bases(member):  # the right kind of value, wrong in itself
                raise error
        fail(f"expected one of {', '.join(_name(m) for m in members)}, got {_describe(value)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            fail(f"expected a list, got {_describe(value)}")
        items = [convert(args[0], item, f"{key}[{i}]", source) for i, item in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            fail(f"expected a mapping, got {_describe(value)}")
        return {convert(str, str(k), f"{key}.{k!r}", source): convert(args[1], v, f"{key}.{k}",
                                                                         source)
                for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if _is_number(value):
            if not math.isfinite(value):
                fail(f"expected a finite number, got {value}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            if _CONTROL.search(value):
                fail(f"expected a single line without control characters, got {ascii(value)}")
            return value
    fail(f"expected {_name(tp)}, got {_describe(value)}")


def _convert_dataclass(tp: Any, value: Any, key: str, source: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key or '<top level>'}: expected a mapping, "
                          f"got {_describe(value)}")
    hints, fields = _schema(tp)
    kwargs = {}
    for name, item in value.items():
        full = _join(key, str(name))
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f" (did you mean '{_join(key, close[0])}'?)" if close else \
                f" (valid keys: {', '.join(fields)})"
            raise ConfigError(f"{source}: unknown key {full!r}{hint}")
        kwargs[name] = convert(hints[name], item, full, source)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key '{_join(key, name)}'")
    return tp(**kwargs)


@functools.cache
def _schema(tp: Any) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """Annotations and the fields the data gives (not the UNREAD ones), resolved once (a
    manifest has many entries)."""
    return (typing.get_type_hints(tp, include_extras=True),
            {f.name: f for f in dataclasses.fields(tp) if not f.metadata.get(UNREAD)})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bases(tp: Any) -> set[type]:
    """The plain classes a value of an annotation has: {int} for Annotated[int, ...], {list}
    for list[str], {str} for Literal['a', 'b']."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is Literal:
        return {type(choice) for choice in typing.get_args(tp)}
    return {typing.get_origin(tp) or tp}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _spelled(choice: Any) -> str:
    """A Literal's value as the YAML that gives it: true, not True."""
    return str(choice).lower() if isinstance(choice, bool) else str(choice)


def _name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) is Literal:
        return " or ".join(_spelled(choice) for choice in typing.get_args(tp))
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"
