"""The cache store: `open_store(dir)` gives the one object (`LocalStore` or `RemoteStore`)
that owns a cache dir and answers every operation on it. It imports only the ground floor and
the JAX adapter."""
