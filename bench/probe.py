"""A stand-in training entrypoint for the launcher-overhead benchmark.

Its first line records when it ran (wall clock, comparable across processes of one machine)
in the file named by its first argument, both as `bench.probe:main` under the launcher and
as `python -m bench.probe FILE` started directly. It imports nothing else, so the time up
to that line is the start-up of the process and of whatever started it.
"""

import sys
import time


def main() -> int:
    first_line = time.time()
    with open(sys.argv[1], "w") as sink:
        sink.write(repr(first_line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
