-- 0003: the attempt history, and what a receipt saw of the requests that reused it.
--
-- `history` holds one row per event in a message's life: each claim, how each lease ended
-- (sent, retry, ambiguous, dead, released, lease expired, lease lost) and the transitions
-- outside a lease (an OTP expiring in the queue, a dead letter requeued). The statement that
-- makes a change writes its row, so it costs no round trip, and it is pruned with its row.
-- It is append-only: no row is ever updated, so it never bloats. There is no foreign key
-- (a per-row check on the hot path); the statements that delete rows delete their history.
-- Receipts count the requests that mapped onto their send: `created_at` is the first,
-- `last_seen_at` the latest, `reuse_count` how many retried requests reused the receipt.

CREATE TABLE {schema}.history (
    outbox_id bigint NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    event text NOT NULL CHECK (event IN (
        'claimed', 'sent', 'retry', 'ambiguous', 'dead', 'released', 'lease_expired',
        'lease_lost', 'expired', 'requeued')),
    at timestamptz NOT NULL,
    attempt integer,
    lease_token uuid,
    worker_id text,
    lease_expires_at timestamptz,
    retry_delay_seconds double precision,
    error_class text,
    error text,
    dead_reason text,
    provider_message_id text,
    PRIMARY KEY (outbox_id, id)
) WITH (
    fillfactor = 100,
    autovacuum_vacuum_insert_scale_factor = 0.05
);

ALTER TABLE {schema}.receipts
    ADD COLUMN last_seen_at timestamptz,
    ADD COLUMN reuse_count integer NOT NULL DEFAULT 0;

UPDATE {schema}.receipts SET last_seen_at = created_at;
