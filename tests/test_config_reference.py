"""The config reference (docs/config.md's table) against the config's dataclasses
(jaxwarm/core/config.py): every key a config may set has a row, every row names a key that
exists, and a default written in the table is the dataclass's, so the reference cannot fall
behind the schema.

A row's key cell names one key or several, the later ones by their last part
(`topology.nodes`, `.processes_per_node`); its default cell is `required`, empty (the field's
default is None or empty), a value in backticks read as YAML (as the config is), a
comma-separated list of plain values, one per key, or prose (`4 GiB`), which is not checked.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import yaml

from jaxwarm.core.config import Config
from jaxwarm.core.decode import UNREAD
from tests.conftest import REPO

REFERENCE = REPO / "docs" / "config.md"
REQUIRED = "required"


def schema_keys() -> dict[str, Any]:
    """Every key a config may set (a section's as `section.key`) -> its default, or
    REQUIRED."""
    def default(field: dataclasses.Field[Any]) -> Any:
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return REQUIRED

    keys: dict[str, Any] = {}
    hints = typing.get_type_hints(Config)
    for field in dataclasses.fields(Config):
        if field.metadata.get(UNREAD):
            continue
        if dataclasses.is_dataclass(hints[field.name]):
            for sub in dataclasses.fields(hints[field.name]):
                keys[f"{field.name}.{sub.name}"] = default(sub)
        else:
            keys[field.name] = default(field)
    return keys


def reference_rows() -> list[tuple[list[str], str]]:
    """The table's rows as (the keys, the default cell), `.rest` names made whole."""
    rows = []
    for line in REFERENCE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        keys = [names[0], *(names[0].rsplit(".", 1)[0] + name for name in names[1:])]
        rows.append((keys, cells[1]))
    return rows


def written_defaults(keys: list[str], cell: str) -> dict[str, Any] | None:
    """What the default cell says of each key, or None where it is prose."""
    if cell == REQUIRED:
        return dict.fromkeys(keys, REQUIRED)
    if cell == "":
        return dict.fromkeys(keys, None)
    quoted = re.fullmatch(r"`([^`]*)`", cell)
    if quoted and len(keys) == 1:
        return {keys[0]: quoted.group(1)}
    values = [value.strip() for value in cell.split(",")]
    if len(values) == len(keys) and all(re.fullmatch(r"-?[\d.]+", v) for v in values):
        return dict(zip(keys, values, strict=True))
    return None


def same_default(written: Any, actual: Any) -> bool:
    if written is None:
        return actual is None or actual in ({}, [])
    if written == REQUIRED or isinstance(actual, str):
        return written == actual
    return yaml.safe_load(written) == actual


def test_every_config_key_has_a_row_and_every_row_a_key() -> None:
    documented = [key for keys, _ in reference_rows() for key in keys]
    schema = schema_keys()
    assert sorted(set(schema) - set(documented)) == [], "keys missing from docs/config.md"
    assert sorted(set(documented) - set(schema)) == [], "rows of keys the config lacks"
    assert sorted(key for key in set(documented) if documented.count(key) > 1) == []


def test_the_defaults_written_in_the_reference_are_the_dataclasses() -> None:
    schema = schema_keys()
    wrong = []
    for keys, cell in reference_rows():
        written = written_defaults(keys, cell)
        for key, value in (written or {}).items():
            if key in schema and not same_default(value, schema[key]):
                wrong.append(f"{key}: the table says {value!r}, the dataclass {schema[key]!r}")
    assert wrong == []
