"""Benchmarks: scripts that print a table, each comparing against a baseline measured in the same run."""
