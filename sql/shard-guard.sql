-- Optional, with a sharded outbox (OUTBOXD_SHARD_COUNT): refuses a change to the outbox's
-- own partitions that would leave one of them in no publication, or partitions of two
-- moduli, unless the transaction says it follows docs/operations.md ("Sharding: adding
-- shards or changing their count"):
--
--     SET LOCAL outboxd.partition_change = 'on';
--
-- Why: rows written to a partition that no publication holds are decoded by no slot, then
-- or ever; outboxd notices only at its next layout check, and if the service deletes its
-- outbox rows as it writes them, no remedy can publish them. Refused here: CREATE TABLE
-- ... PARTITION OF the outbox and ATTACH PARTITION of a table no publication holds, and a
-- partition of another modulus. Allowed: DETACH (inserts of the missing remainder fail
-- until it is back), a detached shard attached again (its publication still holds it),
-- partitions below the shards (by day), and the table and partitions `outboxd init`
-- creates (in the transaction that creates the table).
--
-- Run once per database, as a superuser (event triggers need one), after `outboxd init`,
-- with 'public.outbox' below set to OUTBOXD_TABLE.
CREATE OR REPLACE FUNCTION public.outboxd_outbox_partitions_guard() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    outbox regclass := pg_catalog.to_regclass('public.outbox');
    touched boolean;
    unpublished text;
    moduli text;
BEGIN
    IF outbox IS NULL
       OR pg_catalog.current_setting('outboxd.partition_change', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    SELECT pg_catalog.bool_or(c.objid = outbox OR EXISTS (
               SELECT 1 FROM pg_catalog.pg_inherits i
                WHERE i.inhrelid = c.objid AND i.inhparent = outbox))
      INTO touched
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
     WHERE c.classid = 'pg_catalog.pg_class'::regclass;
    -- `outboxd init` creates the table and its partitions in one transaction, before
    -- their publications.
    IF NOT coalesce(touched, false) OR (SELECT x.xmin FROM pg_catalog.pg_class x WHERE x.oid = outbox)
                                      = pg_catalog.pg_current_xact_id()::xid THEN
        RETURN;
    END IF;
    SELECT pg_catalog.string_agg(i.inhrelid::regclass::text, ', ' ORDER BY i.inhrelid::regclass::text)
      INTO unpublished
      FROM pg_catalog.pg_inherits i
     WHERE i.inhparent = outbox
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r WHERE r.prrelid = i.inhrelid);
    SELECT pg_catalog.string_agg(DISTINCT pg_catalog.substring(
               pg_catalog.pg_get_expr(p.relpartbound, 0), 'modulus ([0-9]+)'), ', ')
      INTO moduli
      FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class p ON p.oid = i.inhrelid
     WHERE i.inhparent = outbox;
    IF unpublished IS NOT NULL THEN
        RAISE EXCEPTION 'outboxd: % would be a partition of the sharded outbox % that no publication holds: rows written to it would be decoded by no slot', unpublished, outbox
            USING HINT = 'Change the outbox''s partitions as docs/operations.md ("Sharding: adding shards or changing their count") says; its statements run with SET LOCAL outboxd.partition_change = ''on''.';
    END IF;
    IF moduli LIKE '%,%' THEN
        RAISE EXCEPTION 'outboxd: the sharded outbox % would have partitions of moduli %: a shard''s remainder split', outbox, moduli
            USING HINT = 'Change the outbox''s partitions as docs/operations.md ("Sharding: adding shards or changing their count") says; its statements run with SET LOCAL outboxd.partition_change = ''on''.';
    END IF;
END
$$;

DROP EVENT TRIGGER IF EXISTS outboxd_outbox_partitions_guard;
CREATE EVENT TRIGGER outboxd_outbox_partitions_guard ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION public.outboxd_outbox_partitions_guard();
