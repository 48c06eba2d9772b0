"""Benchmarks of the rollout engine (see bench/README.md and docs/benchmarks.md)."""
