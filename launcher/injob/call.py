"""`python -m launcher.injob.call module:function [ARGS...]`: run a function entrypoint.

The function is called like a console script's main: no arguments, sys.argv set to
[spec, *ARGS]; its return value is the exit status.
"""

from __future__ import annotations

import importlib
import sys


def main() -> int:
    if len(sys.argv) < 2 or ":" not in sys.argv[1]:
        print("usage: python -m launcher.injob.call module:function [ARGS...]", file=sys.stderr)
        return 2
    spec = sys.argv[1]
    module_name, _, function_name = spec.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    sys.argv = [spec, *sys.argv[2:]]
    result = function()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
