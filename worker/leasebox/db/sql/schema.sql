-- The canonical leasebox schema. Migrations must produce exactly this (a test compares them).
-- `{schema}` is replaced by the configured schema name, quoted as an identifier.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE {schema}.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    aggregate_id text,
    recipient text NOT NULL,
    template text NOT NULL,
    data jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    secrets bytea,
    delivery_key text NOT NULL UNIQUE,
    -- The recipient normalised (trimmed, case-folded, IDNA domain): what the guard counts.
    recipient_key text,
    -- The producer's scope, for the guard's per-scope limit.
    scope text,
    -- A fingerprint of what the row sends: a delivery key reused for another message conflicts.
    message_hash text,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'processing', 'sent', 'dead')),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 100),
    available_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    lease_token uuid,
    lease_expires_at timestamptz,
    leased_by text,
    sent_at timestamptz,
    provider_message_id text,
    last_error text,
    last_error_class text,
    dead_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Claim: ready rows of a kind, in FIFO order of availability.
CREATE INDEX outbox_ready_idx ON {schema}.outbox (kind, available_at, id)
    WHERE status = 'pending';
-- Backlog: oldest pending age, measured from creation (the SLA clock).
CREATE INDEX outbox_pending_created_idx ON {schema}.outbox (kind, created_at)
    WHERE status = 'pending';
-- Expiry sweep: OTPs past their TTL are dead-lettered, never sent late.
CREATE INDEX outbox_pending_expiry_idx ON {schema}.outbox (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
-- Reclaim: leases that ran out while a worker held them.
CREATE INDEX outbox_leases_idx ON {schema}.outbox (lease_expires_at)
    WHERE status = 'processing';
-- Dead letters by kind and age (list, requeue, purge, backlog counts).
CREATE INDEX outbox_dead_idx ON {schema}.outbox (kind, updated_at)
    WHERE status = 'dead';
-- Send rate and pruning of sent rows.
CREATE INDEX outbox_sent_idx ON {schema}.outbox (sent_at)
    WHERE status = 'sent';
-- The abuse guard's windows: per normalised recipient, and per scope.
CREATE INDEX outbox_recipient_key_created_idx ON {schema}.outbox (recipient_key, created_at);
CREATE INDEX outbox_scope_created_idx ON {schema}.outbox (scope, created_at);

CREATE TABLE {schema}.receipts (
    scope text NOT NULL,
    idempotency_key text NOT NULL,
    request_hash text NOT NULL,
    -- A receipt goes with its row, so it never points at a missing one.
    outbox_id bigint NOT NULL REFERENCES {schema}.outbox (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    -- The latest request that mapped onto the send, and how many retried requests reused it
    -- (`created_at` is the first).
    last_seen_at timestamptz,
    reuse_count integer NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, idempotency_key)
) WITH (fillfactor = 90);

-- Pruning of expired receipts, and the cascade (and live-receipt check) of deleted rows.
CREATE INDEX receipts_expires_idx ON {schema}.receipts (expires_at);
CREATE INDEX receipts_outbox_idx ON {schema}.receipts (outbox_id);

-- The attempt history: one row per event in a message's life (each claim, how each lease
-- ended, an expiry in the queue, a requeue), written by the statement that makes the change
-- and deleted by the statements that delete its row. Append-only, so it never bloats.
CREATE TABLE {schema}.history (
    outbox_id bigint NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    event text NOT NULL CHECK (event IN (
        'claimed', 'sent', 'retry', 'ambiguous', 'dead', 'released', 'lease_expired',
        'lease_lost', 'expired', 'requeued')),
    at timestamptz NOT NULL,
    -- The message's attempt count when the event happened.
    attempt integer,
    -- The lease the event belongs to, and the worker that held it.
    lease_token uuid,
    worker_id text,
    -- lease_expired: when the lease ran out (`at` is when it was taken back).
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

-- Wakes idle workers when rows arrive; one notification per statement, not per row.
CREATE FUNCTION {schema}.notify_outbox() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({notify_channel}, TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();
