"""`python -m jaxwarm`: the `jaxwarm` CLI."""

import sys

from jaxwarm.cli.main import main

sys.exit(main())
