-- A least-privilege role for outboxd: REPLICATION to stream the slot, and nothing else
-- on your data. outboxd reads no table: inserts come from the WAL. Runnable twice.
DO $$ BEGIN
    CREATE ROLE outboxd WITH LOGIN REPLICATION PASSWORD 'change-me';
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
GRANT CONNECT ON DATABASE postgres TO outboxd;     -- use your database's name
-- Only pg_catalog's operators and functions for this role, whatever is planted in public
-- (docs/sql.md). outboxd pins this on its own connections anyway; this covers a session
-- someone opens as the role by hand. It names tables schema-qualified, so nothing breaks.
ALTER ROLE outboxd SET search_path = pg_catalog, pg_temp;
-- `outboxd check` and `outboxd status` read pg_replication_slots and settings, which
-- LOGIN REPLICATION is enough for.
-- `outboxd init` creates the table and publication: run it as the table owner, or run
-- outbox.sql and publication.sql as the owner and let outboxd create only the slot.

-- Who can publish events. Rows: whoever may INSERT into the outbox table (its grants).
-- Emitted messages (only if you set OUTBOXD_MESSAGE_PREFIX; off by default): whoever may
-- execute pg_logical_emit_message, which PostgreSQL grants to PUBLIC. Before turning the
-- prefix on, restrict it (`outboxd check` fails until you do). The overloads differ by
-- version (PostgreSQL 17 added a flush argument): list yours with
--   SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message';
-- and for each one:
--   REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM PUBLIC;
--   GRANT  EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO my_service;
-- The optional heartbeat (OUTBOXD_HEARTBEAT_INTERVAL_MS) calls the (boolean, text, text)
-- overload as outboxd's role: after revoking it from PUBLIC, grant it to outboxd too.
