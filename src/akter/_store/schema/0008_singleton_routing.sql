-- 0008_singleton_routing: a singleton's lease row carries the routing key of the singleton's
-- actor (tenant "default", id ""), so that on Citus the lease rows can live in the actors'
-- shards (issue 16, design principle 7): the loop's fence is then a row lock inside the shard
-- of the singleton's own turns, not a lock on a replicated reference table.
--
-- On plain PostgreSQL the key stays `actor_type` and nothing reads the new column; every lease
-- write fills it from now on. Rows written before this migration, or by a runner of an older
-- version still running beside a newer one, keep NULL: the routing key is a hash computed by
-- the runtime from the type's placement, which SQL cannot compute. `akter citus distribute`
-- fills those from the recorded placements before it moves the table into the actors' shards.
ALTER TABLE {schema}.singletons ADD COLUMN routing_key bigint;
-- The key the Citus statements conflict on (`queries_citus.sql`); unique on plain too, where
-- `actor_type` alone already is.
CREATE UNIQUE INDEX singletons_routing ON {schema}.singletons (routing_key, actor_type);
