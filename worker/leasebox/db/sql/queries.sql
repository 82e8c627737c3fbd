-- Named queries, loaded by name (`-- name: <name>` starts a query, the next line says what it
-- does; `-- fragment:` defines shared SQL that `-- include:` inserts).
-- `{schema}` is the configured schema, quoted as an identifier; `%(x)s` are bound parameters.
-- `coalesce(%(now)s::timestamptz, now())` lets tests inject the clock; production passes NULL
-- so that every worker shares the database's clock.

-- name: find_receipt
-- The receipt of (scope, idempotency_key), whether it expired, and its row's delivery key.
-- A live receipt of the same request is being reused: it is counted and its last sighting
-- moved, in the same statement (a request that conflicts with it changes nothing).
WITH found AS (
    SELECT r.request_hash, r.outbox_id, r.expires_at <= now() AS expired, o.delivery_key
    FROM {schema}.receipts AS r
    JOIN {schema}.outbox AS o ON o.id = r.outbox_id
    WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
),
touched AS (
    UPDATE {schema}.receipts AS r
    SET reuse_count = r.reuse_count + 1, last_seen_at = now()
    FROM found
    WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
      AND NOT found.expired AND found.request_hash = %(request_hash)s
)
SELECT request_hash, outbox_id, expired, delivery_key FROM found;

-- name: find_delivery_key
-- The row holding a delivery key, and whether it sends the same message as the caller's.
SELECT o.id AS outbox_id, o.delivery_key,
       (o.message_hash IS NULL OR o.message_hash = %(message_hash)s) AS same
FROM {schema}.outbox AS o
WHERE o.delivery_key = %(delivery_key)s;

-- name: lock_key
-- Serialise callers on one key until the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: count_recipient_window
-- Logical sends to one normalised recipient inside the abuse guard's window.
SELECT count(*) AS n, min(created_at) AS oldest, now() AS now
FROM {schema}.outbox
WHERE recipient_key = %(recipient_key)s
  AND created_at > now() - make_interval(secs => %(window_seconds)s);

-- name: count_scope_window
-- Logical sends (rows, with or without an idempotency key) in one scope inside the window.
SELECT count(*) AS n, min(created_at) AS oldest, now() AS now
FROM {schema}.outbox
WHERE scope = %(scope)s
  AND created_at > now() - make_interval(secs => %(window_seconds)s);

-- fragment: expired_receipt_replaced
-- A receipt written over one of the same key replaces it only once it has expired, and starts
-- its bookkeeping again; a live one is left as it is (the writer's request maps onto it).
ON CONFLICT (scope, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash,
    outbox_id = excluded.outbox_id,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at,
    last_seen_at = excluded.last_seen_at,
    reuse_count = 0
WHERE {schema}.receipts.expires_at <= now()

-- name: enqueue
-- Write one logical send: reuse a live receipt, else insert the row and its receipt.
-- One statement per logical send: reuse a live receipt, else insert the row (a row with the
-- same delivery key and the same message is the same send; with another message it is a
-- conflict, and no receipt is written) and record the receipt. `source` says which happened.
-- Callers with an explicit delivery key hold its advisory lock, so a row this statement's
-- ON CONFLICT waited for was committed before the statement's snapshot was taken.
-- A live receipt reused by the same request counts the reuse (`touched`); a receipt written
-- or replaced after its expiry starts again at zero.
WITH found AS (
    SELECT r.request_hash, r.outbox_id, o.delivery_key
    FROM {schema}.receipts AS r
    JOIN {schema}.outbox AS o ON o.id = r.outbox_id
    WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
      AND r.expires_at > now()
),
touched AS (
    UPDATE {schema}.receipts AS r
    SET reuse_count = r.reuse_count + 1, last_seen_at = now()
    FROM found
    WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
      AND found.request_hash = %(request_hash)s
),
inserted AS (
    INSERT INTO {schema}.outbox
        (kind, aggregate_id, recipient, recipient_key, scope, message_hash, template, data,
         secrets, delivery_key, max_attempts, available_at, expires_at)
    SELECT %(kind)s, %(aggregate_id)s, %(recipient)s, %(recipient_key)s, %(scope)s,
           %(message_hash)s, %(template)s, %(data)s, %(secrets)s, %(delivery_key)s,
           %(max_attempts)s, coalesce(%(available_at)s::timestamptz, now()), %(expires_at)s
    WHERE NOT EXISTS (SELECT FROM found)
    ON CONFLICT (delivery_key) DO NOTHING
    RETURNING id, delivery_key
),
existing AS (
    SELECT o.id, o.delivery_key,
           (o.message_hash IS NULL OR o.message_hash = %(message_hash)s) AS same
    FROM {schema}.outbox AS o
    WHERE o.delivery_key = %(delivery_key)s
      AND NOT EXISTS (SELECT FROM found) AND NOT EXISTS (SELECT FROM inserted)
),
chosen AS (
    SELECT 'inserted' AS source, id, delivery_key FROM inserted
    UNION ALL
    SELECT 'existing', id, delivery_key FROM existing WHERE same
),
receipt AS (
    INSERT INTO {schema}.receipts
        (scope, idempotency_key, request_hash, outbox_id, expires_at, last_seen_at)
    SELECT %(scope)s, %(idempotency_key)s, %(request_hash)s, chosen.id,
           now() + make_interval(secs => %(ttl_seconds)s), now()
    FROM chosen
    WHERE %(idempotency_key)s::text IS NOT NULL
    -- include: expired_receipt_replaced
)
SELECT 'receipt' AS source, outbox_id, delivery_key, request_hash FROM found
UNION ALL
SELECT source, id, delivery_key, NULL FROM chosen
UNION ALL
SELECT 'conflict', id, delivery_key, NULL FROM existing WHERE NOT same;

-- name: lock_keys
-- Serialise callers on many keys until the end of the transaction: receipts first, in one order.
-- Receipt keys before delivery keys (the order `enqueue` takes them in), each group in the
-- order of its lock's hash, so that no two producers can wait for each other in a cycle.
SELECT count(pg_advisory_xact_lock(s.h))
FROM (
    SELECT 1 AS g, hashtextextended(k, 0) AS h FROM unnest(%(receipt_keys)s::text[]) AS k
    UNION
    SELECT 2, hashtextextended(k, 0) FROM unnest(%(delivery_keys)s::text[]) AS k
    ORDER BY 1, 2
) AS s;

-- name: enqueue_many
-- Write many logical sends in one statement, each as `enqueue` would; nothing on a conflict.
-- The callers hold the advisory locks of every idempotency key and explicit delivery key of
-- the batch (`lock_keys`, pipelined before this), and give each idempotency key once. A row
-- per input (`ord`) says what happened to it; a conflict anywhere writes nothing at all.
WITH input AS (
    SELECT *
    FROM unnest(%(kinds)s::text[], %(aggregate_ids)s::text[], %(recipients)s::text[],
                %(recipient_keys)s::text[], %(message_hashes)s::text[], %(templates)s::text[],
                %(data)s::jsonb[], %(secrets)s::bytea[], %(delivery_keys)s::text[],
                %(max_attempts)s::int[], %(available_at)s::timestamptz[],
                %(expires_at)s::timestamptz[], %(idempotency_keys)s::text[],
                %(request_hashes)s::text[])
         WITH ORDINALITY
         AS i(kind, aggregate_id, recipient, recipient_key, message_hash, template, data,
              secrets, delivery_key, max_attempts, available_at, expires_at, idempotency_key,
              request_hash, ord)
),
-- Each lookup is a LATERAL with LIMIT 1 (the keys are unique), so that it stays one index
-- probe per message however large the tables are.
found AS (
    SELECT i.ord, r.outbox_id, r.delivery_key, r.request_hash = i.request_hash AS same
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT rr.outbox_id, rr.request_hash, o.delivery_key
        FROM {schema}.receipts AS rr
        JOIN {schema}.outbox AS o ON o.id = rr.outbox_id
        WHERE rr.scope = %(scope)s AND rr.idempotency_key = i.idempotency_key
          AND rr.expires_at > now()
        LIMIT 1
    ) AS r
),
to_write AS (
    SELECT i.* FROM input AS i WHERE NOT EXISTS (SELECT FROM found AS f WHERE f.ord = i.ord)
),
existing AS (
    SELECT w.ord, o.id, o.delivery_key,
           (o.message_hash IS NULL OR o.message_hash = w.message_hash) AS same
    FROM to_write AS w
    CROSS JOIN LATERAL (
        SELECT oo.id, oo.delivery_key, oo.message_hash
        FROM {schema}.outbox AS oo
        WHERE oo.delivery_key = w.delivery_key
        LIMIT 1
    ) AS o
),
conflicts AS (
    SELECT ord, outbox_id AS id, delivery_key, 'receipt_conflict' AS source
    FROM found WHERE NOT same
    UNION ALL
    SELECT ord, id, delivery_key, 'conflict' FROM existing WHERE NOT same
),
touched AS (
    UPDATE {schema}.receipts AS r
    SET reuse_count = r.reuse_count + 1, last_seen_at = now()
    FROM found AS f
    JOIN input AS i ON i.ord = f.ord
    WHERE r.scope = %(scope)s AND r.idempotency_key = i.idempotency_key
      AND NOT EXISTS (SELECT FROM conflicts)
),
inserted AS (
    INSERT INTO {schema}.outbox
        (kind, aggregate_id, recipient, recipient_key, scope, message_hash, template, data,
         secrets, delivery_key, max_attempts, available_at, expires_at)
    SELECT d.kind, d.aggregate_id, d.recipient, d.recipient_key, %(scope)s, d.message_hash,
           d.template, d.data, d.secrets, d.delivery_key, d.max_attempts,
           coalesce(d.available_at, now()), d.expires_at
    FROM (
        SELECT DISTINCT ON (w.delivery_key) w.*
        FROM to_write AS w
        WHERE NOT EXISTS (SELECT FROM existing AS e WHERE e.ord = w.ord)
        ORDER BY w.delivery_key, w.ord
    ) AS d
    WHERE NOT EXISTS (SELECT FROM conflicts)
    ORDER BY d.ord
    ON CONFLICT (delivery_key) DO NOTHING
    RETURNING id, delivery_key
),
chosen AS (
    SELECT w.ord, n.id, w.delivery_key, 'inserted' AS source
    FROM to_write AS w
    LEFT JOIN inserted AS n ON n.delivery_key = w.delivery_key
    WHERE NOT EXISTS (SELECT FROM existing AS e WHERE e.ord = w.ord)
      AND NOT EXISTS (SELECT FROM conflicts)
    UNION ALL
    SELECT ord, id, delivery_key, 'existing' FROM existing
    WHERE NOT EXISTS (SELECT FROM conflicts)
),
receipt AS (
    INSERT INTO {schema}.receipts
        (scope, idempotency_key, request_hash, outbox_id, expires_at, last_seen_at)
    SELECT %(scope)s, w.idempotency_key, w.request_hash, c.id,
           now() + make_interval(secs => %(ttl_seconds)s), now()
    FROM chosen AS c
    JOIN to_write AS w ON w.ord = c.ord
    WHERE w.idempotency_key IS NOT NULL AND c.id IS NOT NULL
    -- include: expired_receipt_replaced
)
SELECT ord, 'receipt' AS source, outbox_id AS id, delivery_key FROM found
WHERE NOT EXISTS (SELECT FROM conflicts)
UNION ALL
SELECT ord, source, id, delivery_key FROM chosen
UNION ALL
SELECT ord, source, id, delivery_key FROM conflicts;

-- name: get_message
-- One outbox row without its secrets, for tools and tests.
SELECT id, kind, aggregate_id, recipient, template, data, delivery_key, status, attempts,
       max_attempts, available_at, expires_at, leased_by, sent_at, provider_message_id,
       last_error, last_error_class, dead_reason, created_at, updated_at
FROM {schema}.outbox
WHERE id = %(id)s;

-- name: backlog
-- Counts and ages per kind, each from a partial index (the operator's poll).
SELECT
    k.kind,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'pending' AND o.kind = k.kind) AS pending,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'pending' AND o.kind = k.kind
        AND o.available_at <= now()) AS ready,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'processing' AND o.kind = k.kind) AS processing,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'processing' AND o.kind = k.kind
        AND o.lease_expires_at < now()) AS expired_leases,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'dead' AND o.kind = k.kind) AS dead,
    (SELECT min(o.created_at) FROM {schema}.outbox AS o
      WHERE o.status = 'pending' AND o.kind = k.kind) AS oldest_pending_created_at,
    (SELECT min(o.available_at) FROM {schema}.outbox AS o
      WHERE o.status = 'pending' AND o.kind = k.kind
        AND o.available_at <= now()) AS oldest_ready_available_at,
    (SELECT count(*) FROM {schema}.outbox AS o
      WHERE o.status = 'sent' AND o.kind = k.kind
        AND o.sent_at > now() - make_interval(secs => %(window_seconds)s)) AS sent_in_window,
    now() AS observed_at
FROM unnest(%(kinds)s::text[]) AS k(kind)
ORDER BY k.kind;

-- name: known_kinds
-- The kinds that have pending, processing or dead rows.
SELECT DISTINCT kind FROM {schema}.outbox WHERE status IN ('pending', 'processing', 'dead')
ORDER BY kind;

-- name: claim
-- Lease up to a batch of ready, unexpired rows of some kinds, oldest availability first.
-- An OTP past its expiry is never claimed (no attempt spent on it): the sweep dead-letters it.
-- Each claim is written to the history (`claimed`) by the same statement.
WITH candidates AS (
    SELECT c.id
    FROM unnest(%(kinds)s::text[]) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT o.id, o.available_at
        FROM {schema}.outbox AS o
        WHERE o.kind = k.kind
          AND o.status = 'pending'
          AND o.available_at <= coalesce(%(now)s::timestamptz, now())
          AND (o.expires_at IS NULL OR o.expires_at > coalesce(%(now)s::timestamptz, now()))
        ORDER BY o.available_at, o.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.available_at, c.id
    LIMIT %(limit)s
),
claimed AS (
    UPDATE {schema}.outbox AS o
    SET status = 'processing',
        lease_token = gen_random_uuid(),
        lease_expires_at = coalesce(%(now)s::timestamptz, now())
            + make_interval(secs => %(lease_seconds)s),
        leased_by = %(worker_id)s,
        attempts = o.attempts + 1,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM candidates
    WHERE o.id = candidates.id
    RETURNING o.id, o.kind, o.aggregate_id, o.recipient, o.template, o.data, o.secrets,
              o.delivery_key, o.attempts, o.max_attempts, o.expires_at, o.lease_token,
              o.lease_expires_at, o.created_at, o.available_at
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, lease_expires_at)
    SELECT id, 'claimed', coalesce(%(now)s::timestamptz, now()), attempts, lease_token,
           %(worker_id)s, lease_expires_at
    FROM claimed
)
-- RETURNING has no order of its own: hand the rows out oldest first, as they were chosen.
SELECT id, kind, aggregate_id, recipient, template, data, secrets, delivery_key, attempts,
       max_attempts, expires_at, lease_token, lease_expires_at, created_at,
       coalesce(%(now)s::timestamptz, now()) AS claimed_at
FROM claimed
ORDER BY available_at, id;

-- fragment: lost_leases
-- The settling statements' batch rows whose lease no longer matched (rows still in the
-- outbox), each with the `claimed` history row `c` of the lease it lost.
FROM d
JOIN {schema}.outbox AS o ON o.id = d.id
LEFT JOIN {schema}.history AS c
    ON c.outbox_id = d.id AND c.lease_token = d.token AND c.event = 'claimed'
WHERE d.id NOT IN (SELECT id FROM settled)

-- name: mark_sent
-- Settle sent rows whose lease token still matches, with their history; returns their latency.
-- The four settling statements share one shape: `d` is the batch as the worker sends it,
-- `settled` the rows whose lease token still matches, `logged` their history rows, and
-- `lost` a `lease_lost` row for each of the others (a lease this worker, `worker_id`, no
-- longer held): what it learnt, so that a late provider id or error is not forgotten. The
-- attempt of a lost lease is the one its claim recorded; a row deleted meanwhile gets none.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(provider_message_ids)s::text[])
        AS d(id, token, provider_message_id)
),
settled AS (
    UPDATE {schema}.outbox AS o
    SET status = 'sent',
        sent_at = coalesce(%(now)s::timestamptz, now()),
        provider_message_id = d.provider_message_id,
        lease_token = NULL,
        lease_expires_at = NULL,
        last_error = NULL,
        last_error_class = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing'
    RETURNING o.id, o.sent_at - o.created_at AS latency, o.attempts, o.leased_by, d.token,
              d.provider_message_id
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, provider_message_id)
    SELECT id, 'sent', coalesce(%(now)s::timestamptz, now()), attempts, token, leased_by,
           provider_message_id
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, provider_message_id)
    SELECT d.id, 'lease_lost', coalesce(%(now)s::timestamptz, now()), c.attempt, d.token,
           %(worker_id)s, d.provider_message_id
    -- include: lost_leases
)
SELECT id, latency FROM settled;

-- name: schedule_retry
-- Return rows whose lease still matches to pending, ready after their delay, with their history.
-- The history says `ambiguous` rather than `retry` when the provider may have taken the message.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays)s::float8[],
                %(errors)s::text[], %(error_classes)s::text[])
        AS d(id, token, delay, error, error_class)
),
settled AS (
    UPDATE {schema}.outbox AS o
    SET status = 'pending',
        available_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => d.delay),
        last_error = d.error,
        last_error_class = d.error_class,
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing'
    RETURNING o.id, o.attempts, o.leased_by, d.token, d.delay, d.error, d.error_class
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, retry_delay_seconds,
         error_class, error)
    SELECT id, CASE error_class WHEN 'ambiguous' THEN 'ambiguous' ELSE 'retry' END,
           coalesce(%(now)s::timestamptz, now()), attempts, token, leased_by, delay,
           error_class, error
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, error_class, error)
    SELECT d.id, 'lease_lost', coalesce(%(now)s::timestamptz, now()), c.attempt, d.token,
           %(worker_id)s, d.error_class, d.error
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: mark_dead
-- Dead-letter rows whose lease still matches, with a reason and their history.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(reasons)s::text[],
                %(errors)s::text[], %(error_classes)s::text[])
        AS d(id, token, reason, error, error_class)
),
settled AS (
    UPDATE {schema}.outbox AS o
    SET status = 'dead',
        dead_reason = d.reason,
        last_error = d.error,
        last_error_class = d.error_class,
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing'
    RETURNING o.id, o.attempts, o.leased_by, d.token, d.reason, d.error, d.error_class
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, dead_reason, error_class,
         error)
    SELECT id, 'dead', coalesce(%(now)s::timestamptz, now()), attempts, token, leased_by,
           reason, error_class, error
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, error_class, error)
    SELECT d.id, 'lease_lost', coalesce(%(now)s::timestamptz, now()), c.attempt, d.token,
           %(worker_id)s, d.error_class, d.error
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: extend_leases
-- Push the expiry of leases still held to now plus the lease length.
UPDATE {schema}.outbox AS o
SET lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + make_interval(secs => %(lease_seconds)s),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing'
RETURNING o.id, o.lease_expires_at;

-- name: release_leases
-- Give rows back unsent and ready at once, undoing the claim's attempt, with their history.
-- `released` records the attempt given back (a processing row has counted at least one).
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
),
settled AS (
    UPDATE {schema}.outbox AS o
    SET status = 'pending',
        available_at = coalesce(%(now)s::timestamptz, now()),
        attempts = greatest(o.attempts - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing'
    RETURNING o.id, o.attempts, o.leased_by, d.token
),
logged AS (
    INSERT INTO {schema}.history (outbox_id, event, at, attempt, lease_token, worker_id)
    SELECT id, 'released', coalesce(%(now)s::timestamptz, now()), attempts + 1, token,
           leased_by
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history (outbox_id, event, at, attempt, lease_token, worker_id)
    SELECT d.id, 'lease_lost', coalesce(%(now)s::timestamptz, now()), c.attempt, d.token,
           %(worker_id)s
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: reclaim_expired_leases
-- Take back rows whose lease ran out; out of attempts they become dead. With their history.
-- `expired` locks each row and reads its lease (token, expiry, holder) before the UPDATE
-- clears it, so that the history's `lease_expired` row names the lease that ran out.
WITH expired AS (
    SELECT id, lease_token, lease_expires_at, leased_by
    FROM {schema}.outbox
    WHERE status = 'processing'
      AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reclaimed AS (
    UPDATE {schema}.outbox AS o
    SET status = CASE WHEN o.attempts >= coalesce(o.max_attempts, %(default_max_attempts)s)
                      THEN 'dead' ELSE 'pending' END,
        dead_reason = CASE WHEN o.attempts >= coalesce(o.max_attempts, %(default_max_attempts)s)
                           THEN 'attempts_exhausted' END,
        available_at = coalesce(%(now)s::timestamptz, now()),
        last_error = 'lease expired while held by ' || coalesce(o.leased_by, 'unknown worker'),
        last_error_class = 'lease_expired',
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM expired
    WHERE o.id = expired.id
    RETURNING o.id, o.kind, o.status, o.attempts, o.dead_reason, expired.lease_token,
              expired.lease_expires_at, expired.leased_by
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, event, at, attempt, lease_token, worker_id, lease_expires_at, dead_reason)
    SELECT id, 'lease_expired', coalesce(%(now)s::timestamptz, now()), attempts, lease_token,
           leased_by, lease_expires_at, dead_reason
    FROM reclaimed
)
SELECT id, kind, status FROM reclaimed;

-- name: dead_letter_expired
-- Dead-letter pending rows past their expires_at (reason expired), with their history.
WITH expired AS (
    SELECT id
    FROM {schema}.outbox
    WHERE status = 'pending'
      AND expires_at IS NOT NULL
      AND expires_at < coalesce(%(now)s::timestamptz, now())
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
dead AS (
    UPDATE {schema}.outbox AS o
    SET status = 'dead',
        dead_reason = 'expired',
        last_error = 'expired before it could be sent',
        last_error_class = 'expired',
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM expired
    WHERE o.id = expired.id
    RETURNING o.id, o.kind, o.attempts, o.dead_reason
),
logged AS (
    INSERT INTO {schema}.history (outbox_id, event, at, attempt, dead_reason)
    SELECT id, 'expired', coalesce(%(now)s::timestamptz, now()), attempts, dead_reason
    FROM dead
)
SELECT id, kind FROM dead;

-- fragment: dead_letter_selection
-- The filters of `leasebox dead-letters`: kinds, reason, age and ids, each optional.
status = 'dead'
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(reason)s::text IS NULL OR dead_reason = %(reason)s::text)
  AND (%(older_than_seconds)s::float8 IS NULL
       OR updated_at < now() - make_interval(secs => %(older_than_seconds)s::float8))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))

-- name: list_dead_letters
-- Dead letters matching a selection, oldest first, without content.
SELECT id, kind, aggregate_id, delivery_key, attempts, max_attempts, dead_reason,
       last_error_class, last_error, created_at, updated_at
FROM {schema}.outbox
WHERE
-- include: dead_letter_selection
ORDER BY updated_at, id
LIMIT %(limit)s;

-- name: requeue_dead_letters
-- Make matching dead letters pending again with a fresh attempt budget, with their history.
WITH chosen AS (
    SELECT id FROM {schema}.outbox
    WHERE
    -- include: dead_letter_selection
    ORDER BY updated_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
requeued AS (
    UPDATE {schema}.outbox AS o
    SET status = 'pending',
        attempts = 0,
        available_at = now(),
        dead_reason = NULL,
        expires_at = CASE WHEN %(clear_expiry)s THEN NULL ELSE o.expires_at END,
        updated_at = now()
    FROM chosen
    WHERE o.id = chosen.id
    RETURNING o.id
),
logged AS (
    INSERT INTO {schema}.history (outbox_id, event, at)
    SELECT id, 'requeued', now() FROM requeued
)
SELECT id FROM requeued;

-- name: count_dead_letters
-- How many dead letters match a selection.
SELECT count(*)
FROM {schema}.outbox
WHERE
-- include: dead_letter_selection

-- name: purge_dead_letters
-- Delete one batch of dead letters matching a selection, and their history.
WITH doomed AS (
    SELECT id FROM {schema}.outbox
    WHERE
    -- include: dead_letter_selection
    LIMIT %(limit)s
),
deleted AS (
    DELETE FROM {schema}.outbox AS o USING doomed WHERE o.id = doomed.id
    RETURNING o.id
),
forgotten AS (
    DELETE FROM {schema}.history AS h USING deleted WHERE h.outbox_id = deleted.id
)
SELECT id FROM deleted;

-- name: prune_sent
-- Delete one batch of sent rows older than the retention that no live receipt references,
-- and their history.
WITH doomed AS (
    SELECT o.id FROM {schema}.outbox AS o
    WHERE o.status = 'sent'
      AND o.sent_at < now() - make_interval(secs => %(retention_seconds)s)
      AND NOT EXISTS (SELECT FROM {schema}.receipts AS r
                      WHERE r.outbox_id = o.id AND r.expires_at > now())
    ORDER BY o.sent_at
    LIMIT %(limit)s
),
deleted AS (
    DELETE FROM {schema}.outbox AS o USING doomed WHERE o.id = doomed.id
    RETURNING o.id
),
forgotten AS (
    DELETE FROM {schema}.history AS h USING deleted WHERE h.outbox_id = deleted.id
)
SELECT id FROM deleted;

-- name: prune_receipts
-- Delete one batch of receipts expired longer ago than the retention.
WITH doomed AS (
    SELECT scope, idempotency_key FROM {schema}.receipts
    WHERE expires_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY expires_at
    LIMIT %(limit)s
)
DELETE FROM {schema}.receipts AS r USING doomed
WHERE r.scope = doomed.scope AND r.idempotency_key = doomed.idempotency_key;

-- name: listen
-- Subscribe to the outbox's insert notifications.
LISTEN {notify_channel_name};

-- name: schema_present
-- Whether the outbox and receipts tables exist in a schema.
SELECT count(*) = 2 FROM pg_catalog.pg_tables
WHERE schemaname = %(schema_name)s AND tablename IN ('outbox', 'receipts');

-- name: schema_version
-- The newest migration applied to the schema (the operator and the worker compare it with theirs).
SELECT coalesce(max(version), 0) FROM {schema}.schema_migrations;
