-- OTP send semantics: a message replaces the older messages of its replacement key
-- ("resend code" supersedes), `superseded` is a terminal event of the history, and what the
-- shared provider quotas and the kinds' priorities need.

-- Supersession. A message with a replacement key deletes the older pending messages of that
-- key from the queue with a `superseded` history row naming it; a worker that holds an older
-- one checks the outbox for a newer message right before it writes it to the wire.
ALTER TABLE {schema}.outbox ADD COLUMN replacement_key text;
CREATE INDEX outbox_replacement_idx ON {schema}.outbox (replacement_key, id)
    WHERE replacement_key IS NOT NULL;
ALTER TABLE {schema}.queue ADD COLUMN replacement_key text;
CREATE INDEX queue_replacement_idx ON {schema}.queue (replacement_key)
    WHERE replacement_key IS NOT NULL;
ALTER TABLE {schema}.history ADD COLUMN superseded_by bigint;
-- Widening the allowed events reads the history once to validate the new check. The old
-- check's name depends on the upgrade path (0004 built this table beside the one it replaced).
DO $$
DECLARE
    v_name text;
BEGIN
    SELECT c.conname INTO v_name
    FROM pg_catalog.pg_constraint AS c
    WHERE c.conrelid = '{schema}.history'::regclass AND c.contype = 'c'
      AND pg_catalog.pg_get_constraintdef(c.oid) LIKE '%event%';
    EXECUTE format('ALTER TABLE {schema}.history DROP CONSTRAINT %I', v_name);
END;
$$;
ALTER TABLE {schema}.history ADD CONSTRAINT history_event_check CHECK (event IN (
    'claimed', 'sent', 'retry', 'ambiguous', 'dead', 'released', 'lease_expired',
    'lease_lost', 'expired', 'requeued', 'superseded'));

-- Provider quotas shared by every worker of an account (see schema.sql).
CREATE TABLE {schema}.quotas (
    account text PRIMARY KEY,
    rate double precision NOT NULL CHECK (rate > 0),
    burst integer NOT NULL CHECK (burst >= 1),
    next_at timestamptz NOT NULL,
    paused_until timestamptz,
    updated_at timestamptz NOT NULL
);

-- A message gone from the queue is `sent` or `superseded`, whichever its history says.
CREATE OR REPLACE VIEW {schema}.messages AS
SELECT o.id, o.bucket, o.kind, o.aggregate_id, o.recipient, o.recipient_key, o.scope,
       o.message_hash, o.template, o.data, o.delivery_key,
       coalesce(q.status, s.event, 'sent') AS status,
       coalesce(q.attempts, s.attempt, 0) AS attempts,
       coalesce(q.max_attempts, o.max_attempts) AS max_attempts,
       coalesce(q.available_at, o.created_at) AS available_at,
       CASE WHEN q.id IS NULL THEN o.expires_at ELSE q.expires_at END AS expires_at,
       q.lease_token, q.lease_expires_at, coalesce(q.leased_by, s.worker_id) AS leased_by,
       CASE WHEN s.event = 'sent' THEN s.at END AS sent_at, s.provider_message_id,
       q.last_error, q.last_error_class, q.dead_reason,
       o.created_at, coalesce(q.updated_at, s.at, o.created_at) AS updated_at,
       o.replacement_key, s.superseded_by
FROM {schema}.outbox AS o
LEFT JOIN {schema}.queue AS q ON q.id = o.id
LEFT JOIN LATERAL (
    SELECT h.event, h.at, h.attempt, h.worker_id, h.provider_message_id, h.superseded_by
    FROM {schema}.history AS h
    WHERE q.id IS NULL AND h.outbox_id = o.id AND h.bucket = o.bucket
      AND h.event IN ('sent', 'superseded')
    ORDER BY h.id DESC
    LIMIT 1
) AS s ON true;

-- `enqueue_message` takes the replacement key and supersedes with it (and still refuses a new
-- message already past its expiry, as 0005 made it).
DROP FUNCTION {schema}.enqueue_message(
    text, text, text, text, text, text, text, jsonb, bytea, text, boolean, integer,
    timestamptz, timestamptz, text, text, double precision, text[]);

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
    p_locks text[],
    p_replacement_key text
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
    IF v_source = 'inserted' AND p_expires_at <= now() THEN
        RETURN QUERY SELECT 'expired', NULL::bigint, p_delivery_key, NULL::text;
        RETURN;
    END IF;
    IF v_source = 'inserted' THEN
        INSERT INTO {schema}.outbox
            (bucket, kind, aggregate_id, recipient, recipient_key, scope, message_hash,
             template, data, secrets, delivery_key, max_attempts, expires_at, replacement_key)
        VALUES ((now() AT TIME ZONE 'UTC')::date, p_kind, p_aggregate_id, p_recipient,
                p_recipient_key, p_scope, p_message_hash, p_template, p_data, p_secrets,
                p_delivery_key, p_max_attempts, p_expires_at, p_replacement_key)
        ON CONFLICT (delivery_key, bucket) DO NOTHING
        RETURNING id, bucket, created_at INTO v_message;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        INSERT INTO {schema}.queue
            (id, bucket, kind, aggregate_id, delivery_key, max_attempts, available_at,
             expires_at, created_at, updated_at, replacement_key)
        VALUES (v_message.id, v_message.bucket, p_kind, p_aggregate_id, p_delivery_key,
                p_max_attempts, coalesce(p_available_at, v_message.created_at), p_expires_at,
                v_message.created_at, v_message.created_at, p_replacement_key);
        IF p_replacement_key IS NOT NULL THEN
            -- The older messages of the key that no worker holds leave the queue now; one a
            -- worker holds is checked by that worker right before it is written to the wire.
            WITH replaced AS (
                DELETE FROM {schema}.queue AS q
                WHERE q.replacement_key = p_replacement_key AND q.status = 'pending'
                  AND q.id < v_message.id
                RETURNING q.id, q.bucket, q.kind, q.attempts
            )
            INSERT INTO {schema}.history
                (outbox_id, bucket, kind, event, at, attempt, superseded_by)
            SELECT r.id, r.bucket, r.kind, 'superseded', now(), r.attempts, v_message.id
            FROM replaced AS r;
        END IF;
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
