"""Tests of the house rules: layering, parameters, tiers, the release, the benchmarks' runner."""
