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

-- Retention. A key may be deleted only once its event can no longer arrive again: keep
-- rows LONGER than the longest replay (how far back outboxd can re-send after a crash is
-- small, but a consumer group reset to the earliest offset replays the whole topic) AND
-- longer than the topic's retention.ms. For example, with a 7-day topic retention:
--   DELETE FROM public.inbox_processed WHERE processed_at < now() - interval '14 days';
-- Payments and settlements: keep the keys as long as the business record (no TTL).
-- inbox_versions needs no retention: one row per aggregate, and a deleted row would let a
-- replayed old version through.
