"""The reader of typed values (jaxwarm.core.decode): what a schema says by its annotations,
read the same for the config, a factory's step.args and jaxwarm's JSON files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest

from jaxwarm.core.config import parse_config
from jaxwarm.core.decode import UNREAD, Bound, CommandLine, NumbersAsText, convert
from jaxwarm.core.errors import ConfigError
from tests.test_config import demo_raw


@dataclass(frozen=True)
class Job:
    argv: Annotated[list[str], CommandLine()] | None = None
    labels: dict[str, Annotated[str, NumbersAsText()]] = field(default_factory=dict)
    name: str = ""
    kind: Literal["train", "prewarm"] = "train"
    agree: Literal[True, False, "auto"] = "auto"
    size: Annotated[int, Bound(1)] | Literal["auto"] = "auto"
    origin: str = field(default="", metadata={UNREAD: True})


def read(data: Any) -> Job:
    result: Job = convert(Job, data, "job", "f.json")
    return result


def refused(data: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        read(data)
    return str(exc.value)


def test_a_literal_takes_its_values_and_names_them_when_refused() -> None:
    assert read({"kind": "prewarm", "agree": False}) == Job(kind="prewarm", agree=False)
    assert refused({"kind": "verify"}) == \
        "f.json: job.kind: expected one of train, prewarm, got 'verify'"
    assert refused({"agree": "yes"}) == "f.json: job.agree: expected one of true, false, auto, " \
                                        "got 'yes'"
    # Values compare by type too: 1 is not true.
    assert refused({"agree": 1}) == "f.json: job.agree: expected one of true, false, auto, " \
                                    "got integer 1"
    assert "job.kind: expected a single line without control" in refused({"kind": "train\n"})


def test_a_literal_in_a_union_keeps_the_member_s_own_error() -> None:
    assert read({"size": 4}).size == 4 and read({"size": "auto"}).size == "auto"
    assert refused({"size": 0}) == "f.json: job.size: expected an integer >= 1, got 0"
    assert refused({"size": "big"}) == "f.json: job.size: expected one of auto, got 'big'"
    assert refused({"size": 2.5}) == "f.json: job.size: expected one of an integer, auto, " \
                                     "got number 2.5"


def test_numbers_as_text_where_the_schema_says_so_only() -> None:
    assert read({"labels": {"n": 4, "r": 0.5}}).labels == {"n": "4", "r": "0.5"}
    assert refused({"name": 4}) == "f.json: job.name: expected a string, got integer 4"
    assert "expected a string, got boolean True" in refused({"labels": {"n": True}})


def test_a_command_line_given_as_one_string_says_no_shell_splits_it() -> None:
    assert read({"argv": ["a", "--b"]}).argv == ["a", "--b"]
    assert refused({"argv": "a --b"}) == (
        "f.json: job.argv: expected a list of arguments (e.g. [jaxwarm-train, --flag]), "
        "got a string; no shell is used to split it")


def test_an_unread_field_is_an_unknown_key_in_the_data() -> None:
    assert "unknown key 'job.origin'" in refused({"origin": "x"})
    raw = {**demo_raw(), "source": "elsewhere.yaml"}
    with pytest.raises(ConfigError, match="unknown key 'source'"):
        parse_config(raw, "demo.yaml")


@pytest.mark.parametrize(("override", "line"), [
    ("topology.platform=tpu", "demo.yaml: topology.platform: expected one of cpu, gpu, "
                              "got 'tpu'"),
    ("mesh.axis_types=manual", "demo.yaml: mesh.axis_types: expected one of auto, explicit, "
                               "got 'manual'"),
    ("slurm.signal=HUP", "demo.yaml: slurm.signal: expected one of USR1, USR2, TERM, INT, "
                         "got 'HUP'"),
    ("ranks.agree=sometimes", "demo.yaml: ranks.agree: expected one of true, false, auto, "
                              "got 'sometimes'"),
])
def test_the_config_s_choices_are_literals(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(demo_raw(), "demo.yaml", [override])
    assert str(exc.value) == line


def test_env_and_sbatch_values_may_be_numbers() -> None:
    config = parse_config(demo_raw(), "demo.yaml", ["env.OMP_NUM_THREADS=4",
                                                    "slurm.extra.nodes=2"])
    assert config.env["OMP_NUM_THREADS"] == "4" and config.slurm.extra["nodes"] == "2"
