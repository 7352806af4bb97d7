#!/bin/sh
# A cluster-style wrapper: a helper Python first (it never imports jax), then exec the trainer.
"$TINY_PYTHON" -c "import sys; print('helper python', sys.version_info[:2])"
exec "$TINY_PYTHON" "$(dirname "$0")/tinytrain.py" "$@"
