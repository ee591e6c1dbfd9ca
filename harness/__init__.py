"""flashcheck harness: formats, oracle, metrics (and, as the project grows, bounds and reports)."""

__version__ = "0.1.0"
