"""Readers of the outside world. They return plain typed records and never import
prometheus_client; every root path is an argument so tests use fixture trees."""
