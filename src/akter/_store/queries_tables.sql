-- Owned tables (docs/guides/owned-tables.md). The statements on the user's owned tables are
-- built with SQLAlchemy Core (akter._row_sql), each scoped to one owner's keys; the ones here
-- are akter's own: the turn's savepoint around a command's sent row writes, and the start
-- check's reads of the catalog.

-- owned_rows_savepoint --
-- taken before a command's first row writes are sent for a read; the newest one of the name wins
SAVEPOINT akter_owned_rows;

-- owned_rows_undo --
-- drops the rows a command that then failed had sent (its own savepoint is the newest)
ROLLBACK TO SAVEPOINT akter_owned_rows;

-- owned_table_columns --
-- one owned table's columns (name, type, not null, position in its primary key) or no row
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       array_position(i.indkey::int2[], a.attnum) AS key_position
FROM pg_attribute a
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum;

-- owned_table_exists --
-- whether the name resolves to a table on this connection's search path
SELECT to_regclass(%(table)s) IS NOT NULL AS found;

-- owned_table_citus --
-- Citus: whether an owned table is hash-distributed by its routing key column, co-located with the actors (no row: not distributed)
SELECT p.partmethod = 'h'
       AND column_to_column_name(p.logicalrelid, p.partkey) = %(column)s
       AND p.colocationid = (SELECT a.colocationid FROM pg_dist_partition a
                             WHERE a.logicalrelid = '{schema}.actors'::regclass) AS colocated
FROM pg_dist_partition p
WHERE p.logicalrelid = to_regclass(%(table)s);
