"""What probes and pre-flights report, shared by their writers and the exporter's readers so that
neither imports the other: ``probe_file`` (the versioned probe result file: written by the probe
and the pre-flight, read by ``exporter.sources.probe_results``) and ``preflight_message`` (the
pre-flight's report in its container's termination message, read back from the node's pod list).
"""
