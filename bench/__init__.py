"""Benchmark suite for the gateway: echo backend, load generator, baselines and proxies."""
