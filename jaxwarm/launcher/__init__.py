"""jaxwarm's launcher: config -> job environment -> job -> cache -> init report; the submit
side (`cli`, `flow`, `submit/`) and what every side shares (config, JAX adapter, store,
in-job hook). Trainers reach the hook through `jaxwarm.enable_cache`."""
