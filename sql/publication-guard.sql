-- Optional: marks every publication change in the WAL, so outboxd stops at the exact
-- position of the change instead of at its next look at the catalog (every few seconds,
-- and at start-up). PostgreSQL decodes each row with the publication as it was when the
-- row was written: a table dropped from the publication and added back, or `publish`
-- changed and changed back, means the rows in between were never sent.
--
-- Run once per database, as a superuser (event triggers need one). outboxd finds the
-- trigger by its name at each start and then asks the stream for logical messages.
-- The message goes through pg_logical_emit_message, executed as the role running the DDL;
-- if you revoked it from PUBLIC (sql/role.sql), SECURITY DEFINER below runs it as the
-- trigger function's owner.
CREATE OR REPLACE FUNCTION public.outboxd_publication_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    -- Transactional: it is decoded at the change's commit, in the change's transaction.
    PERFORM pg_catalog.pg_logical_emit_message(true, 'outboxd.publication', tg_tag);
END
$$;

DROP EVENT TRIGGER IF EXISTS outboxd_publication_guard;
CREATE EVENT TRIGGER outboxd_publication_guard ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION', 'DROP PUBLICATION')
    EXECUTE FUNCTION public.outboxd_publication_changed();
