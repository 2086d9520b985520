"""Development tools, not part of the installed package (``pyproject.toml`` installs ``exporter``
only, and the image carries nothing else): the demo behind ``make demo`` (``devtools.demo``), a
local Prometheus + Alertmanager stack on loopback (``devtools.stack``), the alert timeline that
follows one change through it (``devtools.timeline``), and what the tests and the benchmarks in
``bench/`` share (``devtools.detection``, ``devtools.hostile_lines``). Import them from the
repository root, where ``make``, pytest and ``python -m bench.<name>`` run.
"""
