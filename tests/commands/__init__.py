"""Tests of exporter/commands/: each subcommand's flags, behaviour and output."""
