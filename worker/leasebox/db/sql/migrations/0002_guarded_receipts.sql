-- 0002: what the producer's guarantees need on the row itself, and receipts tied to rows.
--
-- `recipient_key` is the recipient in its one normalised form (trimmed, case-folded, IDNA
-- domain), computed by the producer; the abuse guard counts and indexes it, so letter case
-- cannot bypass a limit. Rows written before have only ASCII addresses (the producer
-- accepted nothing else), for which lower(btrim(...)) is that same form.
-- `scope` lets the guard's per-scope limit count rows, with or without an idempotency key;
-- rows written before get the scope of their receipt, the only place it was recorded.
-- `message_hash` fingerprints what a row sends, so that one delivery key reused for a
-- different message is a conflict instead of a silent merge; NULL (older rows) means unknown.
-- Receipts reference their row and go with it: a receipt never points at a missing row.

ALTER TABLE {schema}.outbox
    ADD COLUMN recipient_key text,
    ADD COLUMN scope text,
    ADD COLUMN message_hash text;

UPDATE {schema}.outbox AS o
SET recipient_key = lower(btrim(o.recipient)),
    scope = (SELECT r.scope FROM {schema}.receipts AS r WHERE r.outbox_id = o.id
             ORDER BY r.created_at LIMIT 1);

DROP INDEX {schema}.outbox_recipient_created_idx;
CREATE INDEX outbox_recipient_key_created_idx ON {schema}.outbox (recipient_key, created_at);
CREATE INDEX outbox_scope_created_idx ON {schema}.outbox (scope, created_at);

DROP INDEX {schema}.receipts_scope_created_idx;
DELETE FROM {schema}.receipts AS r
WHERE NOT EXISTS (SELECT FROM {schema}.outbox AS o WHERE o.id = r.outbox_id);
CREATE INDEX receipts_outbox_idx ON {schema}.receipts (outbox_id);
ALTER TABLE {schema}.receipts
    ADD CONSTRAINT receipts_outbox_id_fkey FOREIGN KEY (outbox_id)
    REFERENCES {schema}.outbox (id) ON DELETE CASCADE;
