"""Benchmarks: each prints a table. Not tests: they measure, they do not assert."""
