-- The publication outboxd reads. Create it BEFORE the replication slot: a slot only sees
-- publications that existed at the WAL position it decodes.
-- publish = 'insert' keeps deletes (insert-then-delete), updates and truncates off the wire.
CREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'insert');

-- The slot is created by `outboxd init` (or by `outboxd run` at start-up while
-- OUTBOXD_CREATE_SLOT=true). By hand:
--   SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput');
