"""`python -m jaxwarm`: the `jaxwarm` CLI."""

import sys

from jaxwarm.launcher.cli import main

sys.exit(main())
