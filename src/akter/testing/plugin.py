"""Pytest plugin: fixtures for akter tests (filled in by the testing toolkit)."""
