"""What the tests and the benchmarks both use to run jaxwarm's processes: JAX processes on
CPU (`jaxproc`), processes as /proc shows them (`procs`), the other-jax venvs (`legs`). It
imports neither `tests` nor `bench`, and the benchmarks import nothing of the tests, so
imports between them go one way (tests -> bench: the tests of the benchmarks, and the step
shapes of `bench.common`)."""
