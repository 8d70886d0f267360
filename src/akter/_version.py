"""The package version, in a module of its own: components read it without the facade."""

__version__ = "0.1.0"
