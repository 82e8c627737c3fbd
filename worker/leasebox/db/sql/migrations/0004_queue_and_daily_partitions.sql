-- 0004: the live queue apart from the messages, and what is kept after sending by day.
--
-- Until 0003 one wide `outbox` row carried a message through its whole life: every claim and
-- every settlement rewrote it through nine indexes, and the sent rows, the attempt history
-- and the receipts stayed in the live queue's heap until `prune` deleted them row by row.
-- Now `outbox` holds the message as the producer wrote it (written once), `queue` holds the
-- narrow state of the messages not sent yet (deleted once sent), and `outbox`, `history` and
-- `receipts` are partitioned by day (`bucket`), so that retention drops a day at once.
-- See schema.sql for each table.
--
-- This migration copies every row: plan for it on a large outbox (`leasebox prune` first
-- makes it short). Rows written before it go to one `<table>_legacy` partition per table,
-- which retention drops whole once its last day is past the retention; sent rows written
-- before 0003 had no history, so their `sent` row is written here from what the outbox row
-- recorded (when, which worker, the provider's id). Receipts expiring later than the legacy
-- partition's days wait in the default partition until `leasebox migrate` (which runs the
-- partition maintenance right after the migrations) gives each day its own.

ALTER TABLE {schema}.outbox RENAME TO outbox_0003;
ALTER TABLE {schema}.outbox_0003 RENAME CONSTRAINT outbox_pkey TO outbox_0003_pkey;
ALTER TABLE {schema}.outbox_0003
    RENAME CONSTRAINT outbox_delivery_key_key TO outbox_0003_delivery_key_key;
ALTER SEQUENCE {schema}.outbox_id_seq RENAME TO outbox_0003_id_seq;
ALTER INDEX {schema}.outbox_recipient_key_created_idx RENAME TO outbox_0003_recipient_key_idx;
ALTER INDEX {schema}.outbox_scope_created_idx RENAME TO outbox_0003_scope_idx;
DROP TRIGGER outbox_notify ON {schema}.outbox_0003;
ALTER TABLE {schema}.receipts RENAME TO receipts_0003;
ALTER TABLE {schema}.receipts_0003 RENAME CONSTRAINT receipts_pkey TO receipts_0003_pkey;
ALTER INDEX {schema}.receipts_outbox_idx RENAME TO receipts_0003_outbox_idx;
ALTER TABLE {schema}.history RENAME TO history_0003;
ALTER TABLE {schema}.history_0003 RENAME CONSTRAINT history_pkey TO history_0003_pkey;
ALTER SEQUENCE {schema}.history_id_seq RENAME TO history_0003_id_seq;

CREATE SEQUENCE {schema}.outbox_id_seq AS bigint;

CREATE TABLE {schema}.outbox (
    id bigint NOT NULL DEFAULT nextval('{schema}.outbox_id_seq'),
    bucket date NOT NULL,
    kind text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    aggregate_id text,
    recipient text NOT NULL,
    recipient_key text,
    scope text,
    message_hash text,
    template text NOT NULL,
    data jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    secrets bytea,
    delivery_key text NOT NULL,
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 100),
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, bucket),
    UNIQUE (delivery_key, bucket)
) PARTITION BY RANGE (bucket);

ALTER SEQUENCE {schema}.outbox_id_seq OWNED BY {schema}.outbox.id;

CREATE INDEX outbox_recipient_key_created_idx ON {schema}.outbox (recipient_key, created_at);
CREATE INDEX outbox_scope_created_idx ON {schema}.outbox (scope, created_at);

CREATE TABLE {schema}.outbox_default PARTITION OF {schema}.outbox DEFAULT;

CREATE TABLE {schema}.queue (
    id bigint PRIMARY KEY,
    bucket date NOT NULL,
    kind text NOT NULL,
    aggregate_id text,
    delivery_key text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processing', 'dead')),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 100),
    available_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    lease_token uuid,
    lease_expires_at timestamptz,
    leased_by text,
    last_error text,
    last_error_class text,
    dead_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'processing') = (lease_token IS NOT NULL))
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX queue_ready_idx ON {schema}.queue (kind, available_at, id)
    WHERE status = 'pending';
CREATE INDEX queue_pending_created_idx ON {schema}.queue (kind, created_at)
    WHERE status = 'pending';
CREATE INDEX queue_pending_expiry_idx ON {schema}.queue (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX queue_leases_idx ON {schema}.queue (lease_expires_at)
    WHERE status = 'processing';
CREATE INDEX queue_dead_idx ON {schema}.queue (kind, updated_at)
    WHERE status = 'dead';

CREATE TABLE {schema}.receipts (
    scope text NOT NULL,
    idempotency_key text NOT NULL,
    bucket date NOT NULL,
    request_hash text NOT NULL,
    outbox_id bigint NOT NULL,
    outbox_bucket date NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    last_seen_at timestamptz,
    reuse_count integer NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, idempotency_key, bucket)
) PARTITION BY RANGE (bucket);

CREATE INDEX receipts_outbox_idx ON {schema}.receipts (outbox_id);
CREATE INDEX receipts_late_idx ON {schema}.receipts (outbox_bucket)
    WHERE outbox_bucket < bucket - 1;

CREATE TABLE {schema}.receipts_default PARTITION OF {schema}.receipts DEFAULT;

CREATE SEQUENCE {schema}.history_id_seq AS bigint;

CREATE TABLE {schema}.history (
    outbox_id bigint NOT NULL,
    bucket date NOT NULL,
    id bigint NOT NULL DEFAULT nextval('{schema}.history_id_seq'),
    kind text NOT NULL,
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
    provider_message_id text
) PARTITION BY RANGE (bucket);

ALTER SEQUENCE {schema}.history_id_seq OWNED BY {schema}.history.id;

CREATE INDEX history_outbox_idx ON {schema}.history (outbox_id);
CREATE INDEX history_sent_idx ON {schema}.history (kind, at) WHERE event = 'sent';

CREATE TABLE {schema}.history_default PARTITION OF {schema}.history DEFAULT;

CREATE VIEW {schema}.messages AS
SELECT o.id, o.bucket, o.kind, o.aggregate_id, o.recipient, o.recipient_key, o.scope,
       o.message_hash, o.template, o.data, o.delivery_key,
       coalesce(q.status, 'sent') AS status,
       coalesce(q.attempts, s.attempt, 0) AS attempts,
       coalesce(q.max_attempts, o.max_attempts) AS max_attempts,
       coalesce(q.available_at, o.created_at) AS available_at,
       CASE WHEN q.id IS NULL THEN o.expires_at ELSE q.expires_at END AS expires_at,
       q.lease_token, q.lease_expires_at, coalesce(q.leased_by, s.worker_id) AS leased_by,
       s.at AS sent_at, s.provider_message_id,
       q.last_error, q.last_error_class, q.dead_reason,
       o.created_at, coalesce(q.updated_at, s.at, o.created_at) AS updated_at
FROM {schema}.outbox AS o
LEFT JOIN {schema}.queue AS q ON q.id = o.id
LEFT JOIN LATERAL (
    SELECT h.at, h.attempt, h.worker_id, h.provider_message_id
    FROM {schema}.history AS h
    WHERE q.id IS NULL AND h.outbox_id = o.id AND h.bucket = o.bucket AND h.event = 'sent'
    ORDER BY h.id DESC
    LIMIT 1
) AS s ON true;

-- One logical send, as `enqueue` writes it (the producer's `enqueue` statement calls this):
-- take the caller's advisory locks (`p_locks`, in order), then reuse a live receipt of the
-- key, or else the message under an explicit delivery key (the same message is the same send,
-- another is a conflict), or else write the message, its queue row, and its receipt. Each
-- statement runs only when the request needs it and gets a snapshot taken after the locks,
-- so it sees what an earlier holder of a lock committed; a function rather than one big
-- statement because a statement would open every day's partition for the lookups the common
-- request (a new message under a key made up for it) never makes. The answer has one row:
-- `source` is `inserted`, `existing`, `receipt` or `conflict`, and no row at all means a
-- message with that delivery key was written concurrently without the lock.
CREATE FUNCTION {schema}.enqueue_message(
    p_kind text,
    p_aggregate_id text,
    p_recipient text,
    p_recipient_key text,
    p_scope text,
    p_message_hash text,
    p_template text,
    p_data jsonb,
    p_secrets bytea,
    p_delivery_key text,
    p_explicit_key boolean,
    p_max_attempts integer,
    p_available_at timestamptz,
    p_expires_at timestamptz,
    p_idempotency_key text,
    p_request_hash text,
    p_ttl_seconds double precision,
    p_locks text[]
) RETURNS TABLE (source text, outbox_id bigint, delivery_key text, request_hash text)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_receipt record;
    v_message record;
    v_source text := 'inserted';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(l.k, 0))
    FROM unnest(p_locks) WITH ORDINALITY AS l (k, n)
    ORDER BY l.n;
    IF p_idempotency_key IS NOT NULL THEN
        -- A live receipt expires after now: it is in today's partition or a later one.
        SELECT r.request_hash, r.outbox_id, r.outbox_bucket, r.bucket INTO v_receipt
        FROM {schema}.receipts AS r
        WHERE r.scope = p_scope AND r.idempotency_key = p_idempotency_key
          AND r.bucket >= (now() AT TIME ZONE 'UTC')::date AND r.expires_at > now()
        LIMIT 1;
        IF FOUND THEN
            SELECT o.delivery_key INTO v_message
            FROM {schema}.outbox AS o
            WHERE o.id = v_receipt.outbox_id AND o.bucket = v_receipt.outbox_bucket;
            -- A receipt whose message is gone (deleted by hand) is no send: the request
            -- makes a new one, whose receipt replaces it below.
            IF FOUND THEN
                IF v_receipt.request_hash = p_request_hash THEN
                    UPDATE {schema}.receipts AS r
                    SET reuse_count = r.reuse_count + 1, last_seen_at = now()
                    WHERE r.scope = p_scope AND r.idempotency_key = p_idempotency_key
                      AND r.bucket = v_receipt.bucket;
                END IF;
                RETURN QUERY SELECT 'receipt', v_receipt.outbox_id, v_message.delivery_key,
                                    v_receipt.request_hash;
                RETURN;
            END IF;
        END IF;
    END IF;
    IF p_explicit_key THEN
        SELECT o.id, o.bucket, (o.message_hash IS NULL OR o.message_hash = p_message_hash) AS same
        INTO v_message
        FROM {schema}.outbox AS o
        WHERE o.delivery_key = p_delivery_key
        LIMIT 1;
        IF FOUND THEN
            IF NOT v_message.same THEN
                RETURN QUERY SELECT 'conflict', v_message.id, p_delivery_key, NULL::text;
                RETURN;
            END IF;
            v_source := 'existing';
        END IF;
    END IF;
    IF v_source = 'inserted' THEN
        INSERT INTO {schema}.outbox
            (bucket, kind, aggregate_id, recipient, recipient_key, scope, message_hash,
             template, data, secrets, delivery_key, max_attempts, expires_at)
        VALUES ((now() AT TIME ZONE 'UTC')::date, p_kind, p_aggregate_id, p_recipient,
                p_recipient_key, p_scope, p_message_hash, p_template, p_data, p_secrets,
                p_delivery_key, p_max_attempts, p_expires_at)
        ON CONFLICT (delivery_key, bucket) DO NOTHING
        RETURNING id, bucket, created_at INTO v_message;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        INSERT INTO {schema}.queue
            (id, bucket, kind, aggregate_id, delivery_key, max_attempts, available_at,
             expires_at, created_at, updated_at)
        VALUES (v_message.id, v_message.bucket, p_kind, p_aggregate_id, p_delivery_key,
                p_max_attempts, coalesce(p_available_at, v_message.created_at), p_expires_at,
                v_message.created_at, v_message.created_at);
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        -- Replaces a receipt of the same key and day only once it has expired or names a
        -- message that is gone (as `expired_receipt_replaced` in queries.sql does).
        INSERT INTO {schema}.receipts AS r
            (scope, idempotency_key, bucket, request_hash, outbox_id, outbox_bucket,
             expires_at, last_seen_at)
        VALUES (p_scope, p_idempotency_key,
                ((now() + make_interval(secs => p_ttl_seconds)) AT TIME ZONE 'UTC')::date,
                p_request_hash, v_message.id, v_message.bucket,
                now() + make_interval(secs => p_ttl_seconds), now())
        ON CONFLICT (scope, idempotency_key, bucket) DO UPDATE
        SET request_hash = excluded.request_hash,
            outbox_id = excluded.outbox_id,
            outbox_bucket = excluded.outbox_bucket,
            created_at = excluded.created_at,
            expires_at = excluded.expires_at,
            last_seen_at = excluded.last_seen_at,
            reuse_count = 0
        WHERE r.expires_at <= now()
           OR NOT EXISTS (SELECT FROM {schema}.outbox AS gone WHERE gone.id = r.outbox_id);
    END IF;
    RETURN QUERY SELECT v_source, v_message.id, p_delivery_key, NULL::text;
END;
$$;

CREATE TRIGGER queue_notify AFTER INSERT ON {schema}.queue
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();

-- The rows written before this migration, one legacy partition per table (only where there
-- are any: a new installation starts with day partitions alone).
DO $$
BEGIN
    IF EXISTS (SELECT FROM {schema}.outbox_0003) THEN
        CREATE TABLE {schema}.outbox_legacy PARTITION OF {schema}.outbox
            FOR VALUES FROM (MINVALUE) TO ((now() AT TIME ZONE 'UTC')::date + 1)
            WITH (fillfactor = 100);
        CREATE TABLE {schema}.history_legacy PARTITION OF {schema}.history
            FOR VALUES FROM (MINVALUE) TO ((now() AT TIME ZONE 'UTC')::date + 1)
            WITH (fillfactor = 100);
    END IF;
    IF EXISTS (SELECT FROM {schema}.receipts_0003) THEN
        CREATE TABLE {schema}.receipts_legacy PARTITION OF {schema}.receipts
            FOR VALUES FROM (MINVALUE) TO ((now() AT TIME ZONE 'UTC')::date + 2)
            WITH (fillfactor = 90);
    END IF;
END;
$$;

INSERT INTO {schema}.outbox
    (id, bucket, kind, aggregate_id, recipient, recipient_key, scope, message_hash, template,
     data, secrets, delivery_key, max_attempts, expires_at, created_at)
SELECT id, (created_at AT TIME ZONE 'UTC')::date, kind, aggregate_id, recipient,
       recipient_key, scope, message_hash, template, data, secrets, delivery_key, max_attempts,
       expires_at, created_at
FROM {schema}.outbox_0003;

INSERT INTO {schema}.queue
    (id, bucket, kind, aggregate_id, delivery_key, status, attempts, max_attempts,
     available_at, expires_at, lease_token, lease_expires_at, leased_by, last_error,
     last_error_class, dead_reason, created_at, updated_at)
SELECT id, (created_at AT TIME ZONE 'UTC')::date, kind, aggregate_id, delivery_key,
       -- A lease without a token could never be settled: its row is ready again.
       CASE WHEN status = 'processing' AND lease_token IS NULL THEN 'pending' ELSE status END,
       attempts, max_attempts, available_at, expires_at,
       CASE WHEN status = 'processing' THEN lease_token END, lease_expires_at, leased_by,
       last_error, last_error_class, dead_reason, created_at, updated_at
FROM {schema}.outbox_0003
WHERE status <> 'sent';

INSERT INTO {schema}.history
    (outbox_id, bucket, id, kind, event, at, attempt, lease_token, worker_id, lease_expires_at,
     retry_delay_seconds, error_class, error, dead_reason, provider_message_id)
SELECT h.outbox_id, (o.created_at AT TIME ZONE 'UTC')::date, h.id, o.kind, h.event, h.at,
       h.attempt,
       h.lease_token, h.worker_id, h.lease_expires_at, h.retry_delay_seconds, h.error_class,
       h.error, h.dead_reason, h.provider_message_id
FROM {schema}.history_0003 AS h
JOIN {schema}.outbox_0003 AS o ON o.id = h.outbox_id;

INSERT INTO {schema}.history
    (outbox_id, bucket, kind, event, at, attempt, worker_id, provider_message_id)
SELECT o.id, (o.created_at AT TIME ZONE 'UTC')::date, o.kind, 'sent',
       coalesce(o.sent_at, o.updated_at),
       o.attempts, o.leased_by, o.provider_message_id
FROM {schema}.outbox_0003 AS o
WHERE o.status = 'sent'
  AND NOT EXISTS (SELECT FROM {schema}.history_0003 AS h
                  WHERE h.outbox_id = o.id AND h.event = 'sent');

INSERT INTO {schema}.receipts
    (scope, idempotency_key, bucket, request_hash, outbox_id, outbox_bucket, created_at,
     expires_at, last_seen_at, reuse_count)
SELECT r.scope, r.idempotency_key, (r.expires_at AT TIME ZONE 'UTC')::date, r.request_hash,
       r.outbox_id, (o.created_at AT TIME ZONE 'UTC')::date, r.created_at, r.expires_at,
       r.last_seen_at, r.reuse_count
FROM {schema}.receipts_0003 AS r
JOIN {schema}.outbox_0003 AS o ON o.id = r.outbox_id;

SELECT setval('{schema}.outbox_id_seq', max(id)) FROM {schema}.outbox_0003 HAVING count(*) > 0;
SELECT setval('{schema}.history_id_seq', max(id)) FROM {schema}.history HAVING count(*) > 0;

DROP TABLE {schema}.receipts_0003;
DROP TABLE {schema}.history_0003;
DROP TABLE {schema}.outbox_0003;
