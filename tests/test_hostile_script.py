"""A config string cannot become shell code in a job script: control characters are refused
in every string (anchored with \\Z, so a trailing newline counts), and what is allowed
arrives quoted, one line per directive."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot

pytestmark = pytest.mark.e2e


ATTACKS = {
    "run.out_dir=\"runs\\n#SBATCH --wrap=touch /tmp/pwned\"": "run.out_dir",
    "slurm.extra={\"gres\\n\": x}": "slurm.extra.'gres\\n'",
    "env={\"FOO\\n\": x}": "env.'FOO\\n'",
    "env={FOO: \"x\\ntouch /tmp/pwned\"}": "env.FOO",
    "slurm.partition=\"gpu\\n\"": "slurm.partition",
    "run.name=\"demo\\r\"": "run.name",
    "cache.dir=\"/tmp/c\\n\"": "cache.dir",
    "entrypoint.args=[\"--x\\u0000\"]": "entrypoint.args[0]",
    "xla_flags=[\"--xla_foo\\t\"]": "xla_flags[0]",
    "jax={jax_foo: \"a\\nb\"}": "jax.jax_foo",
    "step.factory=\"jaxwarm.step:f\\n\"": "step.factory",
    "mesh.axes={\"data\\n\": 1, fsdp: 8}": "mesh.axes.'data\\n'",
}


@pytest.mark.parametrize("override", sorted(ATTACKS))
def test_control_characters_are_refused_wherever_they_would_reach_a_script(
        tmp_path: Path, override: str) -> None:
    before = snapshot(tmp_path)
    for command in (["render", str(DEMO), f"run.out_dir={tmp_path}", override, "--job", "train"],
                    ["launch", str(DEMO), "--local", f"cache.dir={tmp_path / 'c'}", override]):
        result = run_cli(*command)
        assert_refused(result, f"{ATTACKS[override]}: expected a single line without control")
    assert snapshot(tmp_path) == before


def test_what_is_allowed_arrives_quoted_one_line_per_directive(tmp_path: Path) -> None:
    odd = tmp_path / "my runs; $(touch pwned) 'x'"
    result = run_cli("render", str(DEMO), f"run.out_dir={odd}", f"cache.dir={tmp_path / 'c'}",
                     "env={SAFE: \"$(touch pwned); `id` 'q'\"}", "slurm.extra={gres: gpu:8}",
                     "--job", "train")
    assert result.returncode == 0, result.stderr
    script = result.stdout
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert all(line.startswith("#SBATCH --") for line in directives)
    output, = [line for line in directives if line.startswith("#SBATCH --output=")]
    assert output == "#SBATCH --output=" + shlex.quote(
        f"{odd / 'demo' / 'slurm' / 'train'}/%j_0_log.out")
    assert "export SAFE=" + shlex.quote("$(touch pwned); `id` 'q'") in script
    # The setup lines run in a real shell without running anything from the config.
    setup = [line for line in script.splitlines() if line.startswith("export ")]
    subprocess.run(["bash", "-c", "\n".join(setup)], cwd=tmp_path, check=True)
    assert not (tmp_path / "pwned").exists()
