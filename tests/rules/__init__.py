"""Tests of the alert and recording rules and the dashboards, with promtool and real backends."""
