"""Tests of exporter/http/: the endpoints, the page renderer, the web configuration, TLS."""
