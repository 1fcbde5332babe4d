-- A sharded outbox (OUTBOXD_SHARD_COUNT=4): the table partitioned by hash of aggregate_id
-- into 4 partitions public.outbox_shard_0..3, and one publication per partition,
-- outboxd_0..3. Each shard is relayed through its own slot (outboxd_0..3, created by
-- `outboxd init` or at start-up), by one process (OUTBOXD_SHARDS=all) or one process per
-- shard (OUTBOXD_SHARDS=ordinal in a StatefulSet). `outboxd init` with OUTBOXD_SHARD_COUNT
-- set creates all of this itself; this file is for an owner creating it by hand.
-- Change n below for another shard count (it must equal OUTBOXD_SHARD_COUNT).
--
-- An aggregate's rows all land in one partition, so per-aggregate order holds. One
-- transaction's rows for aggregates of different shards are published shard by shard:
-- consumers see them at slightly different times, never out of order per aggregate.
-- Runnable twice. outboxd refuses (check, init and run) a table whose partitions are not
-- exactly these: a partition outside them would be published by no shard.
DO $$
DECLARE
    n constant int := 4;
BEGIN
    CREATE TABLE IF NOT EXISTS public.outbox (
        id             uuid        NOT NULL,
        aggregate_type text        NOT NULL,
        aggregate_id   text        NOT NULL,
        event_type     text        NOT NULL,
        payload        jsonb       NOT NULL,
        headers        jsonb       NULL,
        created_at     timestamptz NOT NULL DEFAULT now(),
        -- a partitioned table's primary key includes the partition key
        PRIMARY KEY (id, aggregate_id)
    ) PARTITION BY HASH (aggregate_id);
    FOR i IN 0 .. n - 1 LOOP
        EXECUTE format(
            'CREATE TABLE IF NOT EXISTS public.outbox_shard_%s PARTITION OF public.outbox '
            'FOR VALUES WITH (MODULUS %s, REMAINDER %s)', i, n, i);
        IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outboxd_' || i) THEN
            -- publish_via_partition_root: a shard partitioned further (by day, say) is
            -- still published under the shard's name
            EXECUTE format(
                'CREATE PUBLICATION outboxd_%s FOR TABLE public.outbox_shard_%s '
                'WITH (publish = ''insert'', publish_via_partition_root = true)', i, i);
        END IF;
    END LOOP;
END $$;
