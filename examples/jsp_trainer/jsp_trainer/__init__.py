"""jsp-train: a small stand-in for a param-decomposition trainer (equinox + optax)."""
