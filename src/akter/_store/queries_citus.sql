-- Citus (issue 16, docs/citus.md): detection and distribution, and the claim variants.
-- Citus has no multi-shard FOR UPDATE SKIP LOCKED and refuses volatile functions in
-- modifications of distributed tables, so on Citus a claim is an unlocked candidate scan across
-- shards, then one single-shard claim per candidate (pipelined), each SKIP LOCKED in its shard.
-- Same block format as queries.sql; loaded into the same catalogue.

-- citus_detect --
-- whether the citus extension is installed in this database (the claim strategy; read only)
SELECT 1 FROM pg_extension WHERE extname = 'citus';

-- citus_is_coordinator --
-- whether this Citus node is the coordinator (migrations and distribution run there)
SELECT citus_is_coordinator() AS coordinator;

-- citus_placed --
-- the schema's tables already known to Citus (distributed or reference)
SELECT c.relname::text AS relname
FROM pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s;

-- citus_table_exists --
-- whether a schema-qualified table exists (distribution needs the migrated tables)
SELECT to_regclass(%(table)s) IS NOT NULL AS present;

-- citus_create_reference --
-- makes a table that belongs to no actor a reference table (a copy on every node)
SELECT create_reference_table(%(table)s::regclass);

-- citus_create_distributed --
-- distributes a per-actor table by routing_key, co-located with the named table (or the default group)
SELECT create_distributed_table(%(table)s::regclass, 'routing_key', colocate_with => %(with)s);
