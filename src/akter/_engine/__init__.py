"""The engine: turns, dispatcher, relay, jobs."""
