"""The YAML jaxwarm reads (a config, a run's pinned copy, an override's value): a config file
read within its size cap, then parsed by a bounded loader: a node budget that counts alias
expansions, a nesting limit, no duplicate keys. Every problem is one ConfigError naming the
file and line. Apart from the schema (`jaxwarm.core.config`), as `jsonio` is from the records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import RefusedFile, open_regular

# Limits of the YAML reader: a config is a few hundred nodes, a few levels deep. Aliases are
# allowed, but what they expand to counts against the budget ("billion laughs" is refused at
# once instead of filling memory), and nesting is refused before Python's recursion limit.
YAML_MAX_NODES = 100_000
# A config (or a run's pinned copy) is a few KB; one of YAML_MAX_NODES values fits well within.
CONFIG_CAP = 16 << 20
YAML_MAX_DEPTH = 64


class YamlRefused(yaml.YAMLError):
    """A YAML document jaxwarm will not read: `line` and `problem` make the one line."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line, self.problem = line, problem


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader with a node budget that counts alias expansions, a nesting limit, and no
    duplicate keys (YAML would keep the last one silently: a second `cache:` section would
    replace the first)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._weights: dict[int, int] = {}
        self._aliased = False  # an alias was read: the budget may be run out by repetition
        self._total = 0  # values so far, each alias counting what it repeats

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        self._depth += 1
        if self._depth > YAML_MAX_DEPTH:
            raise YamlRefused(self.peek_event().start_mark.line + 1,
                              f"nested more than {YAML_MAX_DEPTH} levels deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        weight = self._weights.get(id(node))
        if weight is None:  # a new node (an alias returns one already weighed)
            children = node.value if isinstance(node, yaml.CollectionNode) else []
            if isinstance(node, yaml.MappingNode):
                children = [part for pair in children for part in pair]
            weight = 1 + sum(self._weights.get(id(child), 1) for child in children)
            self._weights[id(node)] = weight
            self._total += 1
        else:
            self._aliased = True
            self._total += weight
        if self._total > YAML_MAX_NODES:  # as soon as it is run out, not at the end
            raise YamlRefused(node.start_mark.line + 1, (
                f"expands to more than {YAML_MAX_NODES} values (aliases repeating anchors)"
                if self._aliased else f"holds more than {YAML_MAX_NODES} values (a config "
                                      f"is a few hundred)") + "; refusing it")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlRefused(line, f"duplicate key {key!r} (first at line {seen[key]}); "
                                        f"YAML would silently keep only the last one")
            seen[key] = line
        return super().construct_mapping(node, deep)


_BoundedLoader.add_constructor("tag:yaml.org,2002:map", _BoundedLoader.construct_yaml_map)


def load_yaml(text: str, source: str) -> Any:
    """Any YAML jaxwarm reads (configs, overrides, pinned configs), through the bounded
    loader; every problem is one ConfigError naming the file and line."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except YamlRefused as exc:
        raise ConfigError(f"{source}:{exc.line}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    raw = load_yaml(text, source)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, "
                          f"got {type(raw).__name__}")
    return raw


def read_config(path: str | Path) -> str:
    data, _ = read_config_bytes(path, follow=True)
    return config_text(data, str(path))


def read_config_bytes(path: str | Path, follow: bool) -> tuple[bytes, os.stat_result]:
    """The bytes of a config within CONFIG_CAP and the stat of the file read (`open_regular`:
    a regular file, through a final link only with `follow`), or one line."""
    try:
        with open_regular(path, CONFIG_CAP, "a config", follow) as source:
            info = os.fstat(source.fileno())
            data = source.read(CONFIG_CAP + 1)
    except RefusedFile as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.why}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    if len(data) > CONFIG_CAP:
        raise ConfigError(f"{path}: cannot read config: more than a config may be "
                          f"({CONFIG_CAP} bytes)")
    return data, info


def config_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start})") from None
