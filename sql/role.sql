-- A least-privilege role for outboxd: REPLICATION to stream the slot, and nothing else
-- on your data. outboxd reads no table: inserts come from the WAL.
CREATE ROLE outboxd WITH LOGIN REPLICATION PASSWORD 'change-me';
GRANT CONNECT ON DATABASE postgres TO outboxd;     -- use your database's name
-- For `outboxd check` / `outboxd status` (reads pg_replication_slots, pg_settings):
GRANT pg_monitor TO outboxd;
-- The optional heartbeat (OUTBOXD_HEARTBEAT_INTERVAL_MS) calls pg_logical_emit_message,
-- which needs REPLICATION (already granted) and nothing more.
-- `outboxd init` creates the table and publication: run it as the table owner, or run
-- outbox.sql and publication.sql as the owner and let outboxd create only the slot.
