"""Benchmarks that measure us against a peer in the same run and print the ratio."""
