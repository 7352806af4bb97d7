"""The reference workload: a Llama-style chunkwise train step and a jsp-train-style trainer."""
