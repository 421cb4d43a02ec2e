"""Benchmarks: measured time and memory, never timed tests."""
