"""`python -m launcher.injob.call [--script NAME] module:function [ARGS...]`: run an entrypoint.

The function is called like a console script's main: no arguments, sys.argv set to
[NAME or spec, *ARGS]; its return value is the exit status.

With `--script NAME` (what the launcher does for `entrypoint.command: [NAME]` when NAME is a
console script), the init recorder is installed first, so a trainer that knows nothing of
jaxwarm still gets the job's init report and its cache settings kept in force. Installing
it touches no device: the trainer's own `jax.distributed.initialize()` still works.
"""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint

USAGE = "usage: python -m launcher.injob.call [--script NAME] module:function [ARGS...]"


def main() -> int:
    argv = sys.argv[1:]
    script = None
    if argv[:1] == ["--script"] and len(argv) >= 2:
        script, argv = argv[1], argv[2:]
    if not argv or ":" not in argv[0]:
        print(USAGE, file=sys.stderr)
        return 2
    spec, args = argv[0], argv[1:]
    if script is not None:
        from launcher.injob.hook import install_recorder
        install_recorder()
    function = EntryPoint(name=script or spec, value=spec, group="console_scripts").load()
    sys.argv = [script or spec, *args]
    result = function()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
