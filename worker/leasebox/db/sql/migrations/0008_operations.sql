-- 0008: the audit trail of what people did through `leasebox web`, an index of failures,
-- and the trace context of the request that enqueued a message.
--
-- `audit` holds one row per action a person asked for (requeue, purge, ...): who, when, on
-- which selection, how many rows it touched, and whether it was done or refused (no role,
-- read-only mode, a failed CSRF check). It is append-only and never pruned by retention.

CREATE TABLE {schema}.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL CHECK (action ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    outcome text NOT NULL CHECK (outcome IN ('done', 'refused', 'failed')),
    selection jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    affected integer NOT NULL DEFAULT 0,
    detail text
);

CREATE INDEX audit_at_idx ON {schema}.audit (at);

-- The failed attempts of the last minutes, for the overview of `leasebox web` (a partial
-- index: it costs a write only when an attempt fails).
CREATE INDEX history_failures_idx ON {schema}.history (at)
    WHERE event IN ('retry', 'ambiguous', 'dead', 'lease_lost', 'lease_expired');

-- The enqueuing request's trace context (W3C `traceparent`, `tracestate`), when the
-- application traced it; `enqueue_message` takes it as a last, optional argument (its body
-- is 0006's, with the replacement key and the refusal of a message already past its expiry).
ALTER TABLE {schema}.outbox ADD COLUMN trace_context jsonb;

DROP FUNCTION {schema}.enqueue_message(
    text, text, text, text, text, text, text, jsonb, bytea, text, boolean, integer,
    timestamptz, timestamptz, text, text, double precision, text[], text);

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
    p_replacement_key text,
    p_trace_context jsonb DEFAULT NULL
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
             template, data, secrets, delivery_key, max_attempts, expires_at, replacement_key,
             trace_context)
        VALUES ((now() AT TIME ZONE 'UTC')::date, p_kind, p_aggregate_id, p_recipient,
                p_recipient_key, p_scope, p_message_hash, p_template, p_data, p_secrets,
                p_delivery_key, p_max_attempts, p_expires_at, p_replacement_key,
                p_trace_context)
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
