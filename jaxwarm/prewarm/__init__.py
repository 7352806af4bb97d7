"""Prewarm jobs, step factories, cache-key prediction and the reference workload."""
