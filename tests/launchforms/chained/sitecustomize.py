"""A sitecustomize the trainer's environment already had: jaxwarm's bootstrap must run it."""
import sys

print("tinytrain: the environment's own sitecustomize ran", file=sys.stderr, flush=True)
