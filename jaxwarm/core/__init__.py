"""The ground floor every side shares: the config and its decoder, the records jaxwarm writes
and reads back, files and locks, the run dir's layout, errors and wording, the job's
environment. It imports nothing of jaxwarm outside it (tests/test_layout.py)."""
