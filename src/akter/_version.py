"""The package version (one source: the runner registry records it, the facade exports it)."""

__version__ = "0.1.0"
