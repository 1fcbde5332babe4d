-- The consumer side of the exactly-once effect (crates/inbox): run in the CONSUMER's
-- database, next to the tables its handler changes. Delivery from Kafka is at least once;
-- these two tables, written in the same transaction as the consumer's own change, make the
-- effect happen once.

-- One row per event already applied (or deliberately skipped), keyed by the idempotency
-- key: the `idempotency_key` header when the producer sets one (OUTBOXD_HEADER_COLUMNS),
-- else the event id (header `id`). Inserted FIRST in the transaction: a conflict means
-- "already applied", and the unique index, not a read-then-write, decides it, so two
-- consumers racing on one event cannot both apply it.
CREATE TABLE IF NOT EXISTS public.inbox_processed (
    consumer     text        NOT NULL,   -- the consumer (group) name: several may share a database
    key          text        NOT NULL,   -- idempotency key, or event id
    event_id     text        NOT NULL,
    topic        text        NOT NULL,
    kafka_partition integer  NOT NULL,
    kafka_offset bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);
-- For retention deletes.
CREATE INDEX IF NOT EXISTS inbox_processed_processed_at ON public.inbox_processed (processed_at);

-- The last applied version per aggregate (the `version` header), so a version at or
-- below it is skipped. NULL: a row created to lock the aggregate before its first version.
CREATE TABLE IF NOT EXISTS public.inbox_versions (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

-- Retention: inbox_prune deletes one consumer's keys processed more than `keep` ago, at
-- most max_rows per call (call it again while it returns max_rows, so no transaction is
-- long), oldest first. A key may be deleted only once its event can no longer arrive
-- again, so keep rows LONGER than every redelivery: the topic's retention.ms (a group
-- reset to the earliest offset replays the whole topic), the longest a version gap may
-- stay held (the committed offset waits at the held record, and the next owner re-reads
-- everything after it), and outboxd's re-sends after a crash (small). docs/inbox.md has
-- the reasoning. For example, with a 7-day topic retention, every few minutes:
--   SELECT public.inbox_prune('balances', interval '14 days');
-- Payments and settlements: keep the keys as long as the business record (no pruning).
-- inbox_versions needs no retention: one row per aggregate, and a deleted row would let a
-- replayed old version through.
CREATE OR REPLACE FUNCTION public.inbox_prune(
    consumer_name text,
    keep          interval,
    max_rows      integer  DEFAULT 10000,
    processed     regclass DEFAULT 'public.inbox_processed'
) RETURNS bigint LANGUAGE plpgsql
-- Pinned: whoever may create in a schema on the caller's search_path cannot stand in for
-- an operator or function below (docs/sql.md); `processed` is a regclass, printed
-- schema-qualified under this path, so it still names the caller's table.
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    deleted bigint;
BEGIN
    IF keep <= interval '0' THEN
        RAISE EXCEPTION 'inbox_prune: keep is %, it must be a positive interval', keep;
    END IF;
    EXECUTE format(
        'WITH gone AS (DELETE FROM %s WHERE ctid = ANY (ARRAY('
        '  SELECT ctid FROM %s WHERE consumer = $1 AND processed_at < pg_catalog.now() - $2'
        '  ORDER BY processed_at LIMIT $3)) RETURNING 1) '
        'SELECT count(*) FROM gone', processed, processed)
        INTO deleted USING consumer_name, keep, max_rows;
    RETURN deleted;
END
$$;
