-- Runnable as written once sql/outbox.sql ran (each run inserts new events). Where your own
-- tables go, the statement is commented out and marked "your business change".

-- 1. The usual pattern: the business change and its event in one transaction.
BEGIN;
-- UPDATE orders SET status = 'paid' WHERE id = 42;   -- your business change goes here
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
VALUES (gen_random_uuid(), 'order', '42', 'OrderPaid',
        '{"order_id": 42, "amount": "19.90"}', '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
COMMIT;

-- 2. Insert-then-delete: the table stays empty; outboxd still relays the insert once.
BEGIN;
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
VALUES (gen_random_uuid(), 'order', '43', 'OrderShipped', '{"order_id": 43}');
DELETE FROM outbox WHERE aggregate_id = '43';
COMMIT;

-- 3. No table at all: a transactional logical message with the OUTBOXD_MESSAGE_PREFIX
-- prefix (default 'outbox'), PostgreSQL 14+. The content is this JSON envelope; "payload"
-- is sent as its exact JSON text (a JSON string payload is sent as the string's bytes).
BEGIN;
SELECT pg_logical_emit_message(true, 'outbox', json_build_object(
    'id', gen_random_uuid(), 'aggregate_type', 'order', 'aggregate_id', '44',
    'event_type', 'OrderCancelled', 'payload', json_build_object('order_id', 44),
    'headers', json_build_object('reason', 'customer'))::text);
COMMIT;
-- Always pass true (transactional): a non-transactional message is relayed even if the
-- transaction that emitted it rolls back.
