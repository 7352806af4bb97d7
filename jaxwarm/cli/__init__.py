"""The `jaxwarm` command: argument parsing (`main`) and the commands' bodies. Nothing imports
it but `jaxwarm/__main__.py` and the console script."""
