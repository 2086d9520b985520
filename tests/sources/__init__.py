"""Tests of exporter/sources/: each reader of the world on fixture trees, files and fake servers."""
