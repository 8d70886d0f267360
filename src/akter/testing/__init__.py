"""Testing toolkit."""
