"""Tests of exporter/collectors/ and the shared node resources: metric families from sources."""
