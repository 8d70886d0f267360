"""Storage: pool, named queries, migrations, clock, embedded server."""
