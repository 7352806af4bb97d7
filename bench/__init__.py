"""jaxwarm's benchmarks: cold vs warm init, verify cost, launcher and prewarm overhead.

Run from the repository root: `python -m bench.run [--quick]` (see bench/run.py). Not
installed with the package; the figures in bench/README.md come from it.
"""
