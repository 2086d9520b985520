"""Tests of the admission webhook: its decisions, bodies, patches and HTTPS server."""
