-- 0005: the abuse guard holds at every isolation level, retention keeps rows once, and a
-- message already past its expiry on the database's clock is refused.
--
-- The guard counts a subject's rows after serialising its callers; under REPEATABLE READ or
-- SERIALIZABLE the count reads the snapshot the caller's transaction took at its first
-- statement, which cannot see what a concurrent request committed after it. So each counted
-- send rewrites its subject's row here first: a caller whose snapshot predates another
-- request's send finds that row rewritten by a transaction it cannot see, and PostgreSQL
-- fails it with a serialization failure (40001) instead of letting it count too few. Under
-- READ COMMITTED the row's lock serialises the callers and each count sees the others.
-- Subjects are hashes (of the recipient's normalised form, of the scope): no address here.
CREATE TABLE {schema}.guard_subjects (
    subject bigint PRIMARY KEY,
    touched_at timestamptz NOT NULL
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- What retention keeps of the days it drops (messages not sent yet, dead letters, messages a
-- live receipt names) moves to a partition of its own, which retention never drops, instead
-- of today's: it is moved once, not again a retention later, and it leaves once nothing
-- wants it any more. Its rows have the bucket 9999-12-31, after every real day.
CREATE TABLE {schema}.outbox_kept PARTITION OF {schema}.outbox
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);
CREATE TABLE {schema}.history_kept PARTITION OF {schema}.history
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);

-- A new message already past its `expires_at` on the database's clock (the clock every worker
-- checks expiry on) is refused, `source = 'expired'`, with nothing written: a producer whose
-- clock runs behind the database's learns it at once instead of losing the message unsent.
CREATE OR REPLACE FUNCTION {schema}.enqueue_message(
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
    IF v_source = 'inserted' AND p_expires_at <= now() THEN
        RETURN QUERY SELECT 'expired', NULL::bigint, p_delivery_key, NULL::text;
        RETURN;
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
