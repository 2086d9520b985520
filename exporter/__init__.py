"""ccl-health-exporter: is this node's collective communication on the fabric it should be?"""

__version__ = "0.1.0"
