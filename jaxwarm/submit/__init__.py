"""The submit side: the launch flow, pinning the config, the `--prewarm auto` fingerprint, and
the backends (local, SLURM through submitit) that run the jobs."""
