-- The outbox table outboxd relays by default (column names are configurable with
-- OUTBOXD_COLUMN_*). A service inserts one row per event in the same transaction as its
-- business change; outboxd publishes it to Kafka once the transaction commits.
CREATE TABLE IF NOT EXISTS public.outbox (
    id             uuid        PRIMARY KEY,            -- event id: the consumer's dedup key (header "id")
    aggregate_type text        NOT NULL,               -- routes the topic: outbox.{aggregate_type}
    aggregate_id   text        NOT NULL,               -- the Kafka key: per-aggregate order is kept
    event_type     text        NOT NULL,               -- header "event_type"
    payload        jsonb       NOT NULL,               -- the record value, sent as stored (json, text and bytea work too)
    headers        jsonb       NULL,                   -- optional extra headers: {"traceparent": "..."}
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- outboxd reads inserts from the WAL, never from the table, so rows can be removed at once.
-- Two ways to keep the table small:
--  1. insert-then-delete in the same transaction (see examples.sql): the table stays empty,
--     the insert is still in the WAL and is relayed; deletes are never published.
--  2. keep rows for auditing and drop old partitions: partition by day on created_at
--     (PARTITION BY RANGE (created_at)) and DROP old partitions. Publish the partitioned
--     table itself with publish_via_partition_root = true (sql/publication.sql): new
--     partitions are then included without touching the publication.
-- Keep rows (or WAL) longer than your worst relay outage only if you may need to
-- re-publish after a lost slot: the slot, not the table, is what outboxd resumes from.
