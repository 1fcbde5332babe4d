-- The publication outboxd reads. Create it BEFORE the replication slot: a slot only sees
-- publications that existed at the WAL position it decodes.
-- publish = 'insert' keeps deletes (insert-then-delete), updates and truncates off the wire.
-- publish_via_partition_root = true: if the outbox is (or becomes) a partitioned table, the
-- server names every partition's rows after public.outbox, using the catalog as it was when
-- the row was written, so partitions attached or detached later change nothing. Without it
-- the server names each partition; outboxd maps partitions back to the table through the
-- current catalog, which misses a partition detached before its rows were relayed.
-- Runnable twice: an existing publication of this name is left as it is (`outboxd check`
-- says whether it publishes the table's inserts). Needs the CREATE privilege on the
-- database (PostgreSQL 15+) and ownership of the table: run it as the table's owner.
DO $$ BEGIN
    CREATE PUBLICATION outboxd FOR TABLE public.outbox
        WITH (publish = 'insert', publish_via_partition_root = true);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- An existing publication: ALTER PUBLICATION outboxd SET (publish_via_partition_root = true);

-- The slot is created by `outboxd init` (or by `outboxd run` at start-up while
-- OUTBOXD_CREATE_SLOT=true). By hand:
--   SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput');
