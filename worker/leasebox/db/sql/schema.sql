-- The canonical leasebox schema. Migrations must produce exactly this (a test compares them).
-- `{schema}` is replaced by the configured schema name, quoted as an identifier.
--
-- A message lives in two places. `outbox` is what the producer wrote (who gets which template
-- with which variables, under which delivery key): one row per logical send, written once and
-- never updated. `queue` is where the message is in its life while it is not sent yet
-- (pending, processing, dead): a narrow row that workers claim, settle and finally delete
-- when the message is sent. So a claim rewrites a row of a few dozen bytes through the few
-- indexes that serve claims, a send deletes it, and the message's content and its sent
-- history never pass through the queue's indexes again. `messages` joins the two back into
-- one row per send, with its status, for people and tools.
--
-- What is kept after sending (the message, its attempt history, its receipts) is partitioned
-- by day (`bucket`), so that retention drops a day at once instead of deleting its rows one
-- by one. Daily partitions are created ahead of time (`leasebox.db.partitions`); a default
-- partition takes whatever arrives for a day that has none, so a write never fails for want
-- of a partition.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE SEQUENCE {schema}.outbox_id_seq AS bigint;

CREATE TABLE {schema}.outbox (
    id bigint NOT NULL DEFAULT nextval('{schema}.outbox_id_seq'),
    -- The UTC day the message was created: its partition. Retention moves a message that is
    -- still wanted (unsent, dead, or named by a live receipt) to a later day before dropping.
    bucket date NOT NULL,
    kind text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{{0,62}}$'),
    aggregate_id text,
    recipient text NOT NULL,
    -- The recipient normalised (trimmed, case-folded, IDNA domain): what the guard counts.
    recipient_key text,
    -- The producer's scope, for the guard's per-scope limit.
    scope text,
    -- A fingerprint of what the row sends: a delivery key reused for another message conflicts.
    message_hash text,
    template text NOT NULL,
    data jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    secrets bytea,
    -- Unique among the retained messages: per partition by this index, across partitions by
    -- the producer's advisory lock on the key and its lookup before it writes.
    delivery_key text NOT NULL,
    -- As the producer asked; the queue holds the values in force.
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 100),
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Messages of one replacement key replace one another ("resend code"): the newest
    -- supersedes every older one not yet sent (`leasebox.messages.OutboxMessage`).
    replacement_key text,
    -- The enqueuing request's trace context (W3C `traceparent`, `tracestate`), when the
    -- application traced it: the worker continues that trace.
    trace_context jsonb,
    PRIMARY KEY (id, bucket),
    UNIQUE (delivery_key, bucket)
) PARTITION BY RANGE (bucket);

ALTER SEQUENCE {schema}.outbox_id_seq OWNED BY {schema}.outbox.id;

-- The abuse guard's windows: per normalised recipient, and per scope.
CREATE INDEX outbox_recipient_key_created_idx ON {schema}.outbox (recipient_key, created_at);
CREATE INDEX outbox_scope_created_idx ON {schema}.outbox (scope, created_at);
-- The newest message of a replacement key: what a worker checks right before the wire.
CREATE INDEX outbox_replacement_idx ON {schema}.outbox (replacement_key, id)
    WHERE replacement_key IS NOT NULL;

CREATE TABLE {schema}.outbox_default PARTITION OF {schema}.outbox DEFAULT;

-- What retention keeps of the days it drops (messages not sent yet, dead letters, messages a
-- live receipt names) moves here once, with the bucket 9999-12-31, after every real day:
-- retention never drops this partition, and removes a row from it once nothing wants it.
CREATE TABLE {schema}.outbox_kept PARTITION OF {schema}.outbox
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);

-- The messages not sent yet, and the dead letters: what workers claim and settle. A row is
-- deleted when its message is sent. It copies from `outbox` what claiming, routing and logs
-- need (kind, aggregate id, delivery key), so a provider that reads no content claims from
-- here alone.
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
    replacement_key text,
    -- A row holds a lease token exactly while it is processing: settling matches on the token.
    CHECK ((status = 'processing') = (lease_token IS NOT NULL))
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Claim: ready rows of a kind, in FIFO order of availability. The backlog counts a kind's
-- pending rows here and takes their oldest creation (the SLA clock) in the same pass. It is
-- the only index of pending rows that begins with the kind: with a second one (as there was
-- until migration 0009), a planner without fresh statistics of a burst might claim through it, read
-- every pending row and sort them for one batch; with one, the claim reads its batch in
-- order whatever the statistics say.
CREATE INDEX queue_ready_idx ON {schema}.queue (kind, available_at, id) INCLUDE (created_at)
    WHERE status = 'pending';
-- Expiry sweep: OTPs past their TTL are dead-lettered, never sent late.
CREATE INDEX queue_pending_expiry_idx ON {schema}.queue (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
-- Reclaim: leases that ran out while a worker held them.
CREATE INDEX queue_leases_idx ON {schema}.queue (lease_expires_at)
    WHERE status = 'processing';
-- Dead letters by kind and age (list, requeue, purge, backlog counts).
CREATE INDEX queue_dead_idx ON {schema}.queue (kind, updated_at)
    WHERE status = 'dead';
-- Supersession: the pending messages of a replacement key, which a newer one replaces.
CREATE INDEX queue_replacement_idx ON {schema}.queue (replacement_key)
    WHERE replacement_key IS NOT NULL;

-- Requests that mapped onto a send. A receipt names its message by id; it lives in the
-- partition of the day it expires (`bucket`), so a lookup of the live receipts reads only
-- today's and later partitions, and retention drops receipts a retention after they expired.
-- One key has one live receipt: the producers serialise on the key's advisory lock.
CREATE TABLE {schema}.receipts (
    scope text NOT NULL,
    idempotency_key text NOT NULL,
    bucket date NOT NULL,
    request_hash text NOT NULL,
    outbox_id bigint NOT NULL,
    -- The day of the message it names (its `outbox` bucket).
    outbox_bucket date NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    -- The latest request that mapped onto the send, and how many retried requests reused it
    -- (`created_at` is the first).
    last_seen_at timestamptz,
    reuse_count integer NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, idempotency_key, bucket)
) PARTITION BY RANGE (bucket);

-- The receipts of a message (a trace; retention keeping a message a live receipt names).
CREATE INDEX receipts_outbox_idx ON {schema}.receipts (outbox_id);
-- Receipts made for a message older than their own day before (a request that reused the
-- delivery key of an old message): what retention checks before it drops a day of messages.
CREATE INDEX receipts_late_idx ON {schema}.receipts (outbox_bucket)
    WHERE outbox_bucket < bucket - 1;

CREATE TABLE {schema}.receipts_default PARTITION OF {schema}.receipts DEFAULT;

-- The abuse guard's counted subjects (a hash of a recipient's normalised form, or of a
-- scope), each rewritten by every send it counts: under REPEATABLE READ or SERIALIZABLE a
-- request whose snapshot cannot see another's send fails on this row with a serialization
-- failure instead of counting too few; under READ COMMITTED its lock serialises the callers.
-- Retention removes the rows no send touched for longer than it keeps.
CREATE TABLE {schema}.guard_subjects (
    subject bigint PRIMARY KEY,
    touched_at timestamptz NOT NULL
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- The attempt history: one row per event in a message's life (each claim, how each lease
-- ended, an expiry in the queue, a requeue), written by the statement that makes the change.
-- It lives in its message's partition (`bucket`) and goes with it. Append-only.
CREATE SEQUENCE {schema}.history_id_seq AS bigint;

CREATE TABLE {schema}.history (
    outbox_id bigint NOT NULL,
    bucket date NOT NULL,
    id bigint NOT NULL DEFAULT nextval('{schema}.history_id_seq'),
    -- The message's kind (the send rate is counted per kind).
    kind text NOT NULL,
    event text NOT NULL CHECK (event IN (
        'claimed', 'sent', 'retry', 'ambiguous', 'dead', 'released', 'lease_expired',
        'lease_lost', 'expired', 'requeued', 'superseded', 'suppressed')),
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
    -- superseded: the newer message of the same replacement key that replaced this one.
    superseded_by bigint
) PARTITION BY RANGE (bucket);

ALTER SEQUENCE {schema}.history_id_seq OWNED BY {schema}.history.id;

-- A message's history (a trace, a lost lease's claim, retention moving a message).
CREATE INDEX history_outbox_idx ON {schema}.history (outbox_id);
-- Sends per second of a kind (the backlog's rate window).
CREATE INDEX history_sent_idx ON {schema}.history (kind, at) WHERE event = 'sent';
-- Failed attempts of the last minutes (the overview of `leasebox web`); written only on a failure.
CREATE INDEX history_failures_idx ON {schema}.history (at)
    WHERE event IN ('retry', 'ambiguous', 'dead', 'lease_lost', 'lease_expired');
-- The message a provider event is about, by the provider's id of it.
CREATE INDEX history_provider_message_idx ON {schema}.history (provider_message_id)
    WHERE event = 'sent' AND provider_message_id IS NOT NULL;

CREATE TABLE {schema}.history_default PARTITION OF {schema}.history DEFAULT;

-- The history of the messages retention keeps (see `outbox_kept`).
CREATE TABLE {schema}.history_kept PARTITION OF {schema}.history
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);

-- What people did through `leasebox web`: one row per action asked for (requeue, purge, ...),
-- with who, when, the selection it applied to, how many rows it touched, and whether it was
-- done or refused (no role, read-only mode, a failed CSRF check). Append-only.
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

-- One row per logical send with where it is: the queue's state while it is there; once it is
-- gone, how it left, from its last `sent`, `superseded` or `suppressed` history row (with
-- when, by whom, the provider's id, or the newer message that replaced it; `suppressed`: its
-- address was on the suppression list when a worker claimed it).
CREATE VIEW {schema}.messages AS
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
      AND h.event IN ('sent', 'superseded', 'suppressed')
    ORDER BY h.id DESC
    LIMIT 1
) AS s ON true;

-- A provider account's send quota, shared by every worker that sends through the account:
-- a token bucket kept as the time its next token is due (`next_at`, the generic cell rate
-- algorithm). A worker reserves tokens with one UPDATE of the row, which orders every
-- reservation of the account; token k of a reservation is due 1/rate after token k-1, and
-- the bucket never holds more than `burst` tokens of credit. `paused_until` is a provider's
-- rate-limit reset (a 429's Retry-After): no token is due before it.
CREATE TABLE {schema}.quotas (
    account text PRIMARY KEY,
    rate double precision NOT NULL CHECK (rate > 0),
    burst integer NOT NULL CHECK (burst >= 1),
    next_at timestamptz NOT NULL,
    paused_until timestamptz,
    updated_at timestamptz NOT NULL
);

-- What the mail services reported after they accepted a message: one row per event, however
-- often a service redelivers it (each time with a new event id of its own), so the row is
-- keyed by what the event is. `provider_message_id` is the service's id of the message (the
-- one the `sent` history row records), `recipient_key` the mailbox it is about (normalised as
-- the outbox's), `occurred_at` the service's time. An event is linked to its message (and so
-- to the message's scope and kind) when the id names a sent one; an event about a message
-- leasebox does not know is kept with `outbox_id` NULL, counted, and suppresses nothing.
CREATE TABLE {schema}.events (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    provider text NOT NULL,
    provider_message_id text NOT NULL,
    recipient_key text NOT NULL,
    event text NOT NULL CHECK (event IN (
        'delivered', 'deferred', 'bounced', 'complained', 'rejected', 'suppressed')),
    occurred_at timestamptz NOT NULL,
    -- bounced: hard (the mailbox does not exist) or soft (full, greylisted, too large).
    bounce_class text CHECK (bounce_class IN ('hard', 'soft')),
    -- The enhanced status code the receiving server answered (`5.1.1`), when reported.
    smtp_status text,
    -- The service's words (a diagnostic, a feedback type), sanitised and bounded.
    detail text,
    -- The domain of the sender, when the event names it ('' when not).
    sending_domain text NOT NULL DEFAULT '',
    outbox_id bigint,
    scope text,
    kind text,
    received_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_message_id, recipient_key, event, occurred_at)
);

-- A message's events (a trace).
CREATE INDEX events_outbox_idx ON {schema}.events (outbox_id) WHERE outbox_id IS NOT NULL;
-- The soft bounces of a mailbox in a window (three soft bounces suppress it for a while).
CREATE INDEX events_soft_bounces_idx ON {schema}.events (recipient_key, occurred_at)
    WHERE event = 'bounced' AND bounce_class = 'soft';
-- Retention, and the events no message claimed.
CREATE INDEX events_received_idx ON {schema}.events (received_at);

-- The mailboxes a scope must not mail, each with why and until when (NULL: for good). A
-- worker that claims a message to one of them settles it `suppressed` instead of sending it.
-- One entry per (scope, mailbox): a stronger reason or a later expiry replaces a weaker one.
CREATE TABLE {schema}.suppressions (
    scope text NOT NULL,
    recipient_key text NOT NULL,
    reason text NOT NULL CHECK (reason IN (
        'complaint', 'hard_bounce', 'soft_bounces', 'provider', 'manual')),
    -- The bounce's status code or a person's note, bounded.
    detail text,
    -- The event that suppressed it, if one did.
    event_id bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    PRIMARY KEY (scope, recipient_key)
);

-- The events received in each hour by provider, sending domain and kind of message (''
-- when the message is unknown): what the operator computes a provider's reputation rates
-- from, in a few rows an hour however many events arrive.
CREATE TABLE {schema}.feedback_hours (
    hour timestamptz NOT NULL,
    provider text NOT NULL,
    sending_domain text NOT NULL,
    kind text NOT NULL,
    -- delivered, bounced_hard, bounced_soft, complained, deferred, rejected, suppressed
    outcome text NOT NULL,
    events bigint NOT NULL,
    PRIMARY KEY (hour, provider, sending_domain, kind, outcome)
);

-- The tokens of signed requests already received (Mailgun signs a token with each request):
-- a request whose token is here is a replay. Shared by every receiver; kept a little longer
-- than a signature's window, after which a replay is refused as stale anyway.
CREATE TABLE {schema}.feedback_tokens (
    provider text NOT NULL,
    token text NOT NULL,
    seen_at timestamptz NOT NULL,
    PRIMARY KEY (provider, token)
);
CREATE INDEX feedback_tokens_seen_idx ON {schema}.feedback_tokens (seen_at);

-- One logical send, as `enqueue` writes it (the producer's `enqueue` statement calls this):
-- take the caller's advisory locks (`p_locks`, in order), then reuse a live receipt of the
-- key, or else the message under an explicit delivery key (the same message is the same send,
-- another is a conflict), or else write the message, its queue row, and its receipt. Each
-- statement runs only when the request needs it and gets a snapshot taken after the locks,
-- so it sees what an earlier holder of a lock committed; a function rather than one big
-- statement because a statement would open every day's partition for the lookups the common
-- request (a new message under a key made up for it) never makes. The answer has one row:
-- `source` is `inserted`, `existing`, `receipt`, `conflict` or `expired` (a new message
-- already past its `expires_at` on the database's clock, which every worker shares: nothing
-- is written), and no row at all means a message with that delivery key was written
-- concurrently without the lock. A message written with a replacement key supersedes the
-- older pending messages of that key in the same transaction (the caller holds the key's
-- lock, so they are all older than it). Its statements run on generic plans, planned once per
-- connection, and every one of them reads by a key an index serves: with sequential scans
-- off, a plan made while a partition's statistics called it empty still probes its index
-- once it is full.
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
    SET enable_seqscan = off
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

-- Wakes idle workers when rows arrive; one notification per statement, not per row.
CREATE FUNCTION {schema}.notify_outbox() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({notify_channel}, TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

CREATE TRIGGER queue_notify AFTER INSERT ON {schema}.queue
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();
