"""`python -m jaxwarm.job.start.call FORM TARGET [ARGS...]`: run a Python training entrypoint
the way Python (or absl) would, with jaxwarm's init recorder installed when it imports jax.

FORM and TARGET, one per launch form (`jaxwarm.submit.jobs.entrypoint_argv` picks it):
- `--script NAME module:function`: a console script; `function()` with sys.argv
  [NAME, *ARGS], as the script pip writes for it calls it;
- `--function module:function` (`entrypoint.function`): `function()` when it takes no
  argument; a `main(argv)` gets argv [module:function, *ARGS] the way absl's `app.run`
  passes it: through `app.run(main, argv=...)` (absl parses its flags and sets up its
  logging) when its module imports `absl.app`, else `main(argv)` directly;
- `--module MODULE` (`entrypoint.module`, or a command `python -m MODULE`): as `python -m`;
- `--path SCRIPT` (a command `python SCRIPT`): as `python SCRIPT`, the script's directory
  first on sys.path.

A return value that is an int is the exit status, as for a console script. The recorder
touches no device, so the trainer's own `jax.distributed.initialize()` still works.
"""

from __future__ import annotations

import inspect
import os
import runpy
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint
from typing import Any

from jaxwarm.core.errors import EXIT_ERROR, say
from jaxwarm.core.moved import moved_import, moved_module

FORMS = ("--script", "--function", "--module", "--path")
USAGE = ("usage: python -m jaxwarm.job.start.call (--script NAME module:function | --function "
         "module:function | --module MODULE | --path SCRIPT) [ARGS...]")


def takes_argv(function: Callable[..., Any]) -> bool:
    """Whether `function` needs one positional argument (absl's `main(argv)`)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called without one
        return False
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in parameters) == 1


def call_function(function: Callable[..., Any], argv: list[str]) -> Any:
    sys.argv = argv
    if not takes_argv(function):
        return function()
    if "absl.app" in sys.modules:
        from absl import app
        app.run(function, argv=argv)  # exits, as it does for the trainer
    return function(argv)


def run(form: str, target: str, args: list[str], script: str | None = None) -> Any:
    if form == "--module":
        sys.argv = [target, *args]
        return runpy.run_module(target, run_name="__main__", alter_sys=True)
    if form == "--path":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        return runpy.run_path(target, run_name="__main__")
    function = EntryPoint(name=script or target, value=target, group="console_scripts").load()
    return call_function(function, [script or target, *args])


def main() -> int:
    argv = sys.argv[1:]
    script = None
    if argv[:1] == ["--script"] and len(argv) >= 3:
        script, argv = argv[1], ["--function", *argv[2:]]
    if len(argv) < 2 or argv[0] not in FORMS or \
            (argv[0] == "--function" and ":" not in argv[1]):
        print(USAGE, file=sys.stderr)
        return EXIT_ERROR
    from jaxwarm.job.start.jaximport import record_when_jax_imports
    record_when_jax_imports()
    try:
        result = run(argv[0], argv[1], argv[2:], script)
    except ImportError as exc:  # of a module of an earlier layout: where it is now, one line
        if argv[0] == "--module" and (moved := moved_module(argv[1])):
            return say(f"entrypoint: module {argv[1]!r} was not found: {moved}")
        if (moved := moved_import(exc)) is None:
            raise
        return say(f"entrypoint {argv[1]}: {moved}")
    return result if isinstance(result, int) and argv[0] not in ("--module", "--path") else 0


if __name__ == "__main__":
    sys.exit(main())
