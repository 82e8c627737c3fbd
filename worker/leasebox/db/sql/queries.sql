-- Named queries, loaded by name (`-- name: <name>` starts a query, the next line says what it
-- does; `-- fragment:` defines shared SQL that `-- include:` inserts).
-- `{schema}` is the configured schema, quoted as an identifier; `%(x)s` are bound parameters.
-- `coalesce(%(now)s::timestamptz, now())` lets tests inject the clock; production passes NULL
-- so that every worker shares the database's clock.
-- A message is its `outbox` row (what to send) and, until it is sent, its `queue` row (where
-- it is); `bucket` is the day partition of a message and of its history (schema.sql).

-- fragment: receipt_message
-- The message (`o`) the receipt `rr` names, by its primary key (id and day). `LIMIT 1` keeps
-- the lookup inside the receipt's loop: joined on the id alone, the planner may scan the
-- whole outbox once per receipt.
CROSS JOIN LATERAL (
    SELECT m.delivery_key FROM {schema}.outbox AS m
    WHERE m.id = rr.outbox_id AND m.bucket = rr.outbox_bucket
    LIMIT 1
) AS o

-- fragment: live_receipt
-- The live receipt of (scope, idempotency_key), with its message's delivery key. A live
-- receipt expires after now, so it lives in today's partition or a later one.
SELECT rr.request_hash, rr.outbox_id, rr.bucket, o.delivery_key
FROM {schema}.receipts AS rr
-- include: receipt_message
WHERE rr.scope = %(scope)s AND rr.idempotency_key = %(idempotency_key)s
  AND rr.bucket >= (now() AT TIME ZONE 'UTC')::date AND rr.expires_at > now()
LIMIT 1

-- fragment: receipt_reused
-- Count a reuse of the receipt `found` names and move its last sighting, when the request is
-- the same (a request that conflicts with it changes nothing).
UPDATE {schema}.receipts AS r
SET reuse_count = r.reuse_count + 1, last_seen_at = now()
FROM found
WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
  AND r.bucket = found.bucket AND found.request_hash = %(request_hash)s

-- name: find_receipt
-- The live receipt of (scope, idempotency_key) and its message's delivery key, if any.
-- A live receipt of the same request is being reused: it is counted in the same statement.
WITH found AS (
    -- include: live_receipt
),
touched AS (
    -- include: receipt_reused
)
SELECT request_hash, outbox_id, delivery_key FROM found;

-- name: find_delivery_key
-- The message holding a delivery key, and whether it sends the same message as the caller's.
SELECT o.id AS outbox_id, o.delivery_key,
       (o.message_hash IS NULL OR o.message_hash = %(message_hash)s) AS same
FROM {schema}.outbox AS o
WHERE o.delivery_key = %(delivery_key)s
LIMIT 1;

-- name: lock_key
-- Serialise callers on one key until the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: touch_guard_subject
-- Serialise the guard's callers on one counted subject, and fail a stale snapshot.
-- The row's lock serialises callers under READ COMMITTED, so the count that follows sees what
-- the previous holder committed. Under REPEATABLE READ and SERIALIZABLE the count reads the
-- caller's snapshot: if another request rewrote the row after that snapshot was taken, this
-- update fails with a serialization failure (40001) rather than let the count miss its send.
INSERT INTO {schema}.guard_subjects AS g (subject, touched_at)
VALUES (hashtextextended(%(subject)s, 0), now())
ON CONFLICT (subject) DO UPDATE SET touched_at = excluded.touched_at
RETURNING g.touched_at;

-- name: count_recipient_window
-- Logical sends to one normalised recipient inside the abuse guard's window.
SELECT count(*) AS n, min(created_at) AS oldest, now() AS now
FROM {schema}.outbox
WHERE recipient_key = %(recipient_key)s
  AND created_at > now() - make_interval(secs => %(window_seconds)s)
  AND bucket >= ((now() - make_interval(secs => %(window_seconds)s)) AT TIME ZONE 'UTC')::date;

-- name: count_scope_window
-- Logical sends (rows, with or without an idempotency key) in one scope inside the window.
SELECT count(*) AS n, min(created_at) AS oldest, now() AS now
FROM {schema}.outbox
WHERE scope = %(scope)s
  AND created_at > now() - make_interval(secs => %(window_seconds)s)
  AND bucket >= ((now() - make_interval(secs => %(window_seconds)s)) AT TIME ZONE 'UTC')::date;

-- fragment: expired_receipt_replaced
-- A receipt written over one of the same key replaces it only once it has expired or names a
-- message that is gone (deleted by hand: its requests make a new send, as if it had never
-- been), and starts its bookkeeping again; a live one is left as it is (the writer's request
-- maps onto it).
ON CONFLICT (scope, idempotency_key, bucket) DO UPDATE
SET request_hash = excluded.request_hash,
    outbox_id = excluded.outbox_id,
    outbox_bucket = excluded.outbox_bucket,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at,
    last_seen_at = excluded.last_seen_at,
    reuse_count = 0
WHERE {schema}.receipts.expires_at <= now()
   OR NOT EXISTS (SELECT FROM {schema}.outbox AS gone
                  WHERE gone.id = {schema}.receipts.outbox_id
                    AND gone.bucket = {schema}.receipts.outbox_bucket)

-- name: enqueue
-- Write one logical send: reuse a live receipt, else the message and its receipt.
-- `enqueue_message` (schema.sql) takes the locks in `locks` (the receipt's key, then an
-- explicit delivery key, unless the caller took them already), then does what `source`
-- says: `receipt` (a live receipt of the key; the caller compares its request hash),
-- `existing` (the message under the explicit delivery key, the same message), `conflict`
-- (another message under it), `expired` (a new message already past its expiry on the
-- database's clock: nothing written), or `inserted`. No row: a row with that delivery key was
-- written concurrently without the lock. Arguments are cast, so that any driver's
-- parameter types find the function.
SELECT source, outbox_id, delivery_key, request_hash
FROM {schema}.enqueue_message(
    p_kind => %(kind)s::text,
    p_aggregate_id => %(aggregate_id)s::text,
    p_recipient => %(recipient)s::text,
    p_recipient_key => %(recipient_key)s::text,
    p_scope => %(scope)s::text,
    p_message_hash => %(message_hash)s::text,
    p_template => %(template)s::text,
    p_data => %(data)s::jsonb,
    p_secrets => %(secrets)s::bytea,
    p_delivery_key => %(delivery_key)s::text,
    p_explicit_key => %(explicit_key)s::boolean,
    p_max_attempts => %(max_attempts)s::integer,
    p_available_at => %(available_at)s::timestamptz,
    p_expires_at => %(expires_at)s::timestamptz,
    p_idempotency_key => %(idempotency_key)s::text,
    p_request_hash => %(request_hash)s::text,
    p_ttl_seconds => %(ttl_seconds)s::float8,
    p_locks => %(locks)s::text[],
    p_replacement_key => %(replacement_key)s::text,
    p_trace_context => %(trace_context)s::jsonb
);

-- name: lock_keys
-- Serialise callers on many keys until the end of the transaction: receipts first, in one order.
-- Receipt keys, then delivery keys, then replacement keys (the order `enqueue` takes them in),
-- each group in the order of its lock's hash, so that no two producers can wait for each other
-- in a cycle.
SELECT count(pg_advisory_xact_lock(s.h))
FROM (
    SELECT 1 AS g, hashtextextended(k, 0) AS h FROM unnest(%(receipt_keys)s::text[]) AS k
    UNION
    SELECT 2, hashtextextended(k, 0) FROM unnest(%(delivery_keys)s::text[]) AS k
    UNION
    SELECT 3, hashtextextended(k, 0) FROM unnest(%(replacement_keys)s::text[]) AS k
    ORDER BY 1, 2
) AS s;

-- name: enqueue_many
-- Write many logical sends in one statement, each as `enqueue` would; nothing on a conflict.
-- The callers hold the advisory locks of every idempotency key and explicit delivery key of
-- the batch (`lock_keys`, pipelined before this), and give each idempotency key once. A row
-- per input (`ord`) says what happened to it; a conflict anywhere writes nothing at all.
-- No step joins one set of the batch's rows to another (the planner, which cannot know a
-- prepared statement's batch size, would loop over one set for each row of the other): each
-- message is looked up on its own (a LATERAL with LIMIT 1, one index probe per partition),
-- and the rest are passes over the batch and one window, so the cost grows with the size of
-- the batch, not with its square. Text columns come as array literals (`text_array`), the
-- messages' data as one JSON array, the others in binary, which psycopg dumps unquoted.
-- A message written with a replacement key supersedes, as `enqueue` does, the key's pending
-- messages in the queue and any earlier message of the batch with the same key (written, never
-- queued): the last of a key in the batch is the one sent.
WITH input AS (
    SELECT *
    FROM unnest(%(kinds)s::text[], %(aggregate_ids)s::text[], %(recipients)s::text[],
                %(recipient_keys)s::text[], %(message_hashes)s::text[], %(templates)s::text[],
                ARRAY(SELECT d.value
                      FROM jsonb_array_elements(%(data)s::jsonb) WITH ORDINALITY AS d(value, n)
                      ORDER BY d.n),
                %(secrets)b::bytea[], %(delivery_keys)s::text[],
                %(explicit_keys)b::bool[], %(max_attempts)b::int[],
                %(available_at)b::timestamptz[], %(expires_at)b::timestamptz[],
                %(idempotency_keys)s::text[], %(request_hashes)s::text[],
                %(replacement_keys)s::text[])
         WITH ORDINALITY
         AS i(kind, aggregate_id, recipient, recipient_key, message_hash, template, data,
              secrets, delivery_key, explicit_key, max_attempts, available_at, expires_at,
              idempotency_key, request_hash, replacement_key, ord)
),
-- What each message finds: a live receipt of its key (with the receipt's message), or else,
-- under an explicit delivery key, the message already holding that key.
looked AS MATERIALIZED (
    SELECT i.*,
           CASE
               WHEN r.outbox_id IS NOT NULL THEN
                   CASE WHEN r.request_hash = i.request_hash THEN 'receipt'
                        ELSE 'receipt_conflict' END
               WHEN e.id IS NOT NULL THEN
                   CASE WHEN e.same THEN 'existing' ELSE 'conflict' END
           END AS found,
           coalesce(r.outbox_id, e.id) AS found_id,
           coalesce(r.outbox_bucket, e.bucket) AS found_bucket,
           -- The delivery key of the message the request maps onto.
           coalesce(r.delivery_key, i.delivery_key) AS sends_key,
           r.bucket AS receipt_bucket,
           -- Taken here, row by row in input order, so that a batch is sent in its order.
           CASE WHEN r.outbox_id IS NULL AND e.id IS NULL
                THEN nextval('{schema}.outbox_id_seq') END AS new_id
    FROM input AS i
    LEFT JOIN LATERAL (
        SELECT rr.outbox_id, rr.outbox_bucket, rr.bucket, rr.request_hash, o.delivery_key
        FROM {schema}.receipts AS rr
        -- include: receipt_message
        WHERE i.idempotency_key IS NOT NULL
          AND rr.scope = %(scope)s AND rr.idempotency_key = i.idempotency_key
          AND rr.bucket >= (now() AT TIME ZONE 'UTC')::date AND rr.expires_at > now()
        LIMIT 1
    ) AS r ON true
    LEFT JOIN LATERAL (
        SELECT oo.id, oo.bucket,
               (oo.message_hash IS NULL OR oo.message_hash = i.message_hash) AS same
        FROM {schema}.outbox AS oo
        WHERE i.explicit_key AND r.outbox_id IS NULL AND oo.delivery_key = i.delivery_key
        LIMIT 1
    ) AS e ON true
),
-- A new message already past its expiry on the database's clock is refused like a conflict.
conflicts AS (
    SELECT ord, found AS source, found_id AS id, sends_key AS delivery_key
    FROM looked
    WHERE found IN ('conflict', 'receipt_conflict')
    UNION ALL
    SELECT ord, 'expired', NULL, delivery_key
    FROM looked
    WHERE found IS NULL AND expires_at <= now()
),
-- A message that found nothing is written, once per delivery key: the first message of the
-- batch with the key writes it (its id is the smallest: only these messages took ids, in
-- input order) and the others with the same key repeat it.
resolved AS (
    SELECT l.*,
           coalesce(l.found, CASE WHEN l.new_id = min(l.new_id) OVER same_key THEN 'inserted'
                                  ELSE 'repeat' END) AS source,
           CASE WHEN l.found IS NULL THEN min(l.new_id) OVER same_key
                ELSE l.found_id END AS id,
           CASE WHEN l.found IS NULL THEN (now() AT TIME ZONE 'UTC')::date
                ELSE l.found_bucket END AS bucket
    FROM looked AS l
    WHERE NOT EXISTS (SELECT FROM conflicts)
    WINDOW same_key AS (PARTITION BY l.delivery_key)
),
touched AS (
    UPDATE {schema}.receipts AS r
    SET reuse_count = r.reuse_count + 1, last_seen_at = now()
    FROM resolved AS f
    WHERE f.source = 'receipt'
      AND r.scope = %(scope)s AND r.idempotency_key = f.idempotency_key
      AND r.bucket = f.receipt_bucket
),
-- Each written message with the newest message the batch writes under its replacement key
-- (ids were taken in input order: the last one of the key).
keyed AS (
    SELECT w.*,
           CASE WHEN w.replacement_key IS NOT NULL THEN
               max(w.id) FILTER (WHERE w.source = 'inserted')
                   OVER (PARTITION BY w.replacement_key)
           END AS newest
    FROM resolved AS w
    WHERE w.source = 'inserted'
),
-- Under the callers' locks no other leasebox writer holds these delivery keys: a row that
-- does was written concurrently by hand, and the insert fails on the unique index.
inserted AS (
    INSERT INTO {schema}.outbox
        (id, bucket, kind, aggregate_id, recipient, recipient_key, scope, message_hash,
         template, data, secrets, delivery_key, max_attempts, expires_at, replacement_key,
         trace_context)
    SELECT w.id, w.bucket, w.kind, w.aggregate_id, w.recipient, w.recipient_key, %(scope)s,
           w.message_hash, w.template, w.data, w.secrets, w.delivery_key, w.max_attempts,
           w.expires_at, w.replacement_key, %(trace_context)s::jsonb
    FROM keyed AS w
    ORDER BY w.ord
),
queued AS (
    INSERT INTO {schema}.queue
        (id, bucket, kind, aggregate_id, delivery_key, max_attempts, available_at, expires_at,
         created_at, updated_at, replacement_key)
    SELECT w.id, w.bucket, w.kind, w.aggregate_id, w.delivery_key, w.max_attempts,
           coalesce(w.available_at, now()), w.expires_at, now(), now(), w.replacement_key
    FROM keyed AS w
    WHERE w.newest IS NULL OR w.id = w.newest
    ORDER BY w.ord
),
-- The pending messages of the batch's replacement keys already in the queue (under the
-- callers' locks of those keys), each found by the key's index.
doomed AS (
    SELECT k.newest, p.id
    FROM (SELECT DISTINCT w.replacement_key, w.newest FROM keyed AS w
          WHERE w.newest IS NOT NULL) AS k
    CROSS JOIN LATERAL (
        SELECT q.id FROM {schema}.queue AS q
        WHERE q.replacement_key = k.replacement_key AND q.status = 'pending'
    ) AS p
),
replaced AS (
    DELETE FROM {schema}.queue AS q
    USING doomed AS d
    WHERE q.id = d.id AND q.status = 'pending'
    RETURNING q.id, q.bucket, q.kind, q.attempts, d.newest
),
superseded AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, superseded_by)
    SELECT id, bucket, kind, 'superseded', now(), attempts, newest
    FROM replaced
    UNION ALL
    SELECT id, bucket, kind, 'superseded', now(), 0, newest
    FROM keyed
    WHERE newest IS NOT NULL AND id <> newest
),
receipt AS (
    INSERT INTO {schema}.receipts
        (scope, idempotency_key, bucket, request_hash, outbox_id, outbox_bucket, expires_at,
         last_seen_at)
    SELECT %(scope)s, w.idempotency_key,
           ((now() + make_interval(secs => %(ttl_seconds)s)) AT TIME ZONE 'UTC')::date,
           w.request_hash, w.id, w.bucket, now() + make_interval(secs => %(ttl_seconds)s), now()
    FROM resolved AS w
    WHERE w.idempotency_key IS NOT NULL AND w.source IN ('inserted', 'repeat', 'existing')
    -- include: expired_receipt_replaced
)
SELECT ord, source, id, sends_key AS delivery_key FROM resolved
UNION ALL
SELECT ord, source, id, delivery_key FROM conflicts;

-- name: get_message
-- One message with where it is, without its secrets, for tools and tests.
SELECT id, kind, aggregate_id, recipient, template, data, delivery_key, status, attempts,
       max_attempts, available_at, expires_at, leased_by, sent_at, provider_message_id,
       last_error, last_error_class, dead_reason, created_at, updated_at
FROM {schema}.messages
WHERE id = %(id)s;

-- name: backlog
-- Counts and ages per kind, each from a partial index (the operator's poll): one scan of a
-- kind's pending rows in the ready index counts them and the ready ones among them, and finds
-- the oldest (the SLA clock; `created_at` is in the index for it). The send
-- rate counts the sends in the window of messages created at most a day before it: it reads
-- the history partitions of two or three days, however many days are retained (a send of an
-- older message, such as a requeued dead letter, is left out of the rate).
SELECT
    k.kind,
    p.pending,
    p.ready,
    (SELECT count(*) FROM {schema}.queue AS q
      WHERE q.status = 'processing' AND q.kind = k.kind) AS processing,
    (SELECT count(*) FROM {schema}.queue AS q
      WHERE q.status = 'processing' AND q.kind = k.kind
        AND q.lease_expires_at < now()) AS expired_leases,
    (SELECT count(*) FROM {schema}.queue AS q
      WHERE q.status = 'dead' AND q.kind = k.kind) AS dead,
    p.oldest_pending_created_at,
    p.oldest_ready_available_at,
    (SELECT count(*) FROM {schema}.history AS h
      WHERE h.event = 'sent' AND h.kind = k.kind
        AND h.at > now() - make_interval(secs => %(window_seconds)s)
        AND h.bucket >= ((now() - make_interval(secs => %(window_seconds)s)
                          - interval '1 day') AT TIME ZONE 'UTC')::date
        AND h.bucket <= (now() AT TIME ZONE 'UTC')::date) AS sent_in_window,
    now() AS observed_at
FROM unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT count(*) AS pending,
           count(*) FILTER (WHERE q.available_at <= now()) AS ready,
           min(q.created_at) AS oldest_pending_created_at,
           min(q.available_at) FILTER (WHERE q.available_at <= now())
               AS oldest_ready_available_at
    FROM {schema}.queue AS q
    WHERE q.status = 'pending' AND q.kind = k.kind
) AS p
ORDER BY k.kind;

-- name: known_kinds
-- The kinds that have pending, processing or dead rows.
SELECT DISTINCT kind FROM {schema}.queue ORDER BY kind;

-- fragment: claimed_rows
-- Lease up to a batch of ready, unexpired rows of some kinds (the common part of the claims).
-- An OTP past its expiry is never claimed (no attempt spent on it): the sweep dead-letters it.
-- Each claim is written to the history (`claimed`) by the same statement.
-- A kind's scan of the ready index starts after the (available_at, id) its cursor names
-- (`after_at`, `after_id`; NULL: from the start). A worker draining a backlog passes the last
-- row it claimed, so that its scan does not walk the index entries of every row claimed
-- before, which stay in the index until a vacuum; now and then it scans from the start, for
-- a row committed late by a transaction that began before the rows it has claimed.
-- Each kind's scan yields its first `limit` rows; of them all, the claim takes the kinds of
-- higher `priority` first, oldest availability first within a priority, except that up to
-- `aged_limit` rows that have waited longer than their kind's `aging` seconds (its SLA, from
-- creation) come before everything (the oldest first): a lower priority never starves.
-- A chosen row whose address its scope must not mail (`barred`: an unexpired entry of the
-- suppression list) is not leased: it leaves the queue as `suppressed`, no attempt spent,
-- with its history row (`suppressed`, the entry's reason in `error`). The list is read only
-- while it holds an entry at all, so an empty list costs the claim nothing.
WITH candidates AS (
    SELECT r.id, r.bucket
    FROM (
        SELECT c.id, c.bucket, c.available_at, k.priority, c.aged,
               row_number() OVER (PARTITION BY c.aged ORDER BY c.available_at, c.id) AS nth
        FROM unnest(%(kinds)s::text[], %(after_at)s::timestamptz[], %(after_id)s::bigint[],
                    %(priorities)s::int[], %(aging)s::float8[])
            AS k(kind, after_at, after_id, priority, aging)
        CROSS JOIN LATERAL (
            SELECT q.id, q.bucket, q.available_at,
                   q.created_at <= coalesce(%(now)s::timestamptz, now())
                                   - make_interval(secs => k.aging) AS aged
            FROM {schema}.queue AS q
            WHERE q.kind = k.kind
              AND (q.available_at, q.id)
                  > (coalesce(k.after_at, '-infinity'::timestamptz), coalesce(k.after_id, 0))
              AND q.status = 'pending'
              AND q.available_at <= coalesce(%(now)s::timestamptz, now())
              AND (q.expires_at IS NULL OR q.expires_at > coalesce(%(now)s::timestamptz, now()))
            ORDER BY q.available_at, q.id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS c
    ) AS r
    ORDER BY (r.aged AND r.nth <= %(aged_limit)s) DESC, r.priority DESC, r.available_at, r.id
    LIMIT %(limit)s
),
barred AS MATERIALIZED (
    SELECT c.id, s.reason, 'suppression_list' AS source
    FROM candidates AS c
    -- Each a probe by key (LIMIT 1 keeps them inside the candidates' loop).
    CROSS JOIN LATERAL (
        SELECT o.scope, o.recipient_key FROM {schema}.outbox AS o
        WHERE o.id = c.id AND o.bucket = c.bucket
        LIMIT 1
    ) AS o
    CROSS JOIN LATERAL (
        SELECT x.reason FROM {schema}.suppressions AS x
        WHERE x.scope = coalesce(o.scope, 'default') AND x.recipient_key = o.recipient_key
          AND (x.expires_at IS NULL OR x.expires_at > coalesce(%(now)s::timestamptz, now()))
        LIMIT 1
    ) AS s
    WHERE EXISTS (SELECT FROM {schema}.suppressions)
),
suppressed AS (
    DELETE FROM {schema}.queue AS q
    USING barred AS b
    -- By key, as the update below: a planner sure of few barred rows would scan the queue.
    WHERE q.id = ANY(ARRAY(SELECT id FROM barred)) AND q.id = b.id
    RETURNING q.id, q.bucket, q.kind, q.aggregate_id, q.delivery_key, q.attempts,
              q.max_attempts, q.expires_at, q.created_at, q.available_at, b.reason, b.source
),
suppressed_logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, worker_id, error_class, error)
    SELECT id, bucket, kind, 'suppressed', coalesce(%(now)s::timestamptz, now()), attempts,
           %(worker_id)s, source, reason
    FROM suppressed
),
claimed AS (
    UPDATE {schema}.queue AS q
    SET status = 'processing',
        lease_token = gen_random_uuid(),
        lease_expires_at = coalesce(%(now)s::timestamptz, now())
            + make_interval(secs => %(lease_seconds)s),
        leased_by = %(worker_id)s,
        attempts = q.attempts + 1,
        updated_at = coalesce(%(now)s::timestamptz, now())
    -- By key, however few rows the queue holds (`ANY` of the chosen ids reads the primary key).
    WHERE q.id = ANY(ARRAY(SELECT id FROM candidates))
      AND NOT q.id = ANY(ARRAY(SELECT id FROM barred))
    RETURNING q.id, q.bucket, q.kind, q.aggregate_id, q.delivery_key, q.attempts,
              q.max_attempts, q.expires_at, q.lease_token, q.lease_expires_at, q.created_at,
              q.available_at, q.replacement_key
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, lease_expires_at)
    SELECT id, bucket, kind, 'claimed', coalesce(%(now)s::timestamptz, now()), attempts,
           lease_token, %(worker_id)s, lease_expires_at
    FROM claimed
)

-- name: claim
-- Lease up to a batch of ready, unexpired rows of some kinds, oldest first, with their content.
-- include: claimed_rows
-- RETURNING has no order of its own: hand the rows out oldest first, as they were chosen. A
-- message whose outbox row is missing comes back without content (the worker dead-letters it).
-- Each message is read by its key (`LIMIT 1` keeps the lookup inside the batch's loop): a join
-- on the key would let a planner that misjudges the day's partition (never analysed after a
-- burst) read all of it for a batch of 100.
-- The suppression check (`barred`) reads the outbox again. Each read sets up every day
-- partition at every claim (about 0.04 ms a partition), but one `contents` step that both
-- read crashed PostgreSQL 18.6 under concurrent claims (in its run-time partition pruning),
-- so the two reads stay apart.
-- The rows found suppressed follow, with their reason and no lease, for the worker to count.
SELECT c.id, c.kind, c.aggregate_id, o.recipient, o.template, o.data, o.secrets,
       c.delivery_key, c.attempts, c.max_attempts, c.expires_at, c.lease_token::text,
       c.lease_expires_at, c.created_at, coalesce(%(now)s::timestamptz, now()) AS claimed_at,
       c.available_at, c.replacement_key, o.trace_context, NULL::text AS suppression
FROM claimed AS c
LEFT JOIN LATERAL (
    SELECT m.recipient, m.template, m.data, m.secrets, m.trace_context FROM {schema}.outbox AS m
    WHERE m.id = c.id AND m.bucket = c.bucket
    LIMIT 1
) AS o ON true
UNION ALL
-- include: suppressed_rows
ORDER BY suppression NULLS FIRST, available_at, id;

-- name: claim_without_content
-- Lease up to a batch of ready rows like `claim`, for a provider that reads no content.
-- include: claimed_rows
SELECT c.id, c.kind, c.aggregate_id, NULL::text AS recipient, NULL::text AS template,
       NULL::jsonb AS data, NULL::bytea AS secrets, c.delivery_key, c.attempts,
       c.max_attempts, c.expires_at, c.lease_token::text, c.lease_expires_at, c.created_at,
       coalesce(%(now)s::timestamptz, now()) AS claimed_at, c.available_at, c.replacement_key,
       NULL::jsonb AS trace_context, NULL::text AS suppression
FROM claimed AS c
UNION ALL
-- include: suppressed_rows
ORDER BY suppression NULLS FIRST, available_at, id;

-- fragment: suppressed_rows
-- The claim's rows found suppressed, in the shape of a claimed row without content or lease.
SELECT s.id, s.kind, s.aggregate_id, NULL::text, NULL::text, NULL::jsonb, NULL::bytea,
       s.delivery_key, s.attempts, s.max_attempts, s.expires_at, NULL::text, NULL::timestamptz,
       s.created_at, coalesce(%(now)s::timestamptz, now()), s.available_at, NULL::text,
       NULL::jsonb, s.reason
FROM suppressed AS s

-- name: newer_replacement
-- The newest message of a replacement key newer than a claimed one, if any has been committed:
-- what a worker asks right before it writes the claimed one to the wire. A newer message was
-- created on the claimed one's day or later, so only those days' partitions are read.
SELECT o.id
FROM {schema}.outbox AS o
WHERE o.replacement_key = %(replacement_key)s AND o.id > %(id)s
  AND o.bucket >= (%(created_at)s::timestamptz AT TIME ZONE 'UTC')::date
ORDER BY o.id DESC
LIMIT 1;

-- fragment: held_by_the_batch
-- The queue rows of the batch `d` whose lease token still matches (the settling statements'),
-- each found by its key. A row holds a token exactly while it is `processing` (the queue's
-- CHECK), so the token says it all, and no partial index of processing rows tempts the
-- planner into reading every row other workers hold.
WHERE q.id = d.id AND q.lease_token = d.token

-- fragment: lost_leases
-- The settling statements' batch rows whose lease no longer matched, with their message's
-- bucket and kind and the attempt their lease's claim recorded (`l`); a message deleted
-- meanwhile (purged) gets none.
FROM d
CROSS JOIN LATERAL (
    SELECT o.bucket, o.kind,
           (SELECT c.attempt FROM {schema}.history AS c
            WHERE c.outbox_id = d.id AND c.bucket = o.bucket AND c.lease_token = d.token
              AND c.event = 'claimed'
            LIMIT 1) AS attempt
    FROM {schema}.outbox AS o
    WHERE o.id = d.id
    LIMIT 1
) AS l
WHERE d.id NOT IN (SELECT id FROM settled)

-- name: mark_sent
-- Settle sent rows whose lease token still matches: out of the queue, into the history.
-- The four settling statements share one shape: `d` is the batch as the worker sends it,
-- `settled` the rows whose lease token still matches, `logged` their history rows, and
-- `lost` a `lease_lost` row for each of the others (a lease this worker, `worker_id`, no
-- longer held): what it learnt, so that a late provider id or error is not forgotten.
-- A sent message leaves the queue; its `sent` history row is the record of the send. The
-- answer is each row's latency in seconds, creation to sent.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(provider_message_ids)s::text[])
        AS d(id, token, provider_message_id)
),
settled AS (
    DELETE FROM {schema}.queue AS q
    USING d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.created_at, q.attempts, q.leased_by, d.token,
              d.provider_message_id
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id,
         provider_message_id)
    SELECT id, bucket, kind, 'sent', coalesce(%(now)s::timestamptz, now()), attempts, token,
           leased_by, provider_message_id
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id,
         provider_message_id)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s, d.provider_message_id
    -- include: lost_leases
)
SELECT id,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - created_at)::float8 AS latency
FROM settled;

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
    UPDATE {schema}.queue AS q
    SET status = 'pending',
        available_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => d.delay),
        last_error = d.error,
        last_error_class = d.error_class,
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.leased_by, d.token, d.delay, d.error,
              d.error_class
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id,
         retry_delay_seconds, error_class, error)
    SELECT id, bucket, kind,
           CASE error_class WHEN 'ambiguous' THEN 'ambiguous' ELSE 'retry' END,
           coalesce(%(now)s::timestamptz, now()), attempts, token, leased_by, delay,
           error_class, error
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, error_class,
         error)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s, d.error_class, d.error
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
    UPDATE {schema}.queue AS q
    SET status = 'dead',
        dead_reason = d.reason,
        last_error = d.error,
        last_error_class = d.error_class,
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.leased_by, d.token, d.reason, d.error,
              d.error_class
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, dead_reason,
         error_class, error)
    SELECT id, bucket, kind, 'dead', coalesce(%(now)s::timestamptz, now()), attempts, token,
           leased_by, reason, error_class, error
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, error_class,
         error)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s, d.error_class, d.error
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: mark_superseded
-- Settle rows a newer message of their replacement key replaced before they were written to
-- the wire: out of the queue, with a `superseded` history row naming the newer message.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(newer)s::bigint[])
        AS d(id, token, newer)
),
settled AS (
    DELETE FROM {schema}.queue AS q
    USING d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.leased_by, d.token, d.newer
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, superseded_by)
    SELECT id, bucket, kind, 'superseded', coalesce(%(now)s::timestamptz, now()), attempts,
           token, leased_by, newer
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: mark_suppressed
-- Settle rows whose lease still matches as suppressed (the provider refused the address as one it suppresses).
-- The row leaves the queue with its history (`suppressed`, the provider's code and words),
-- and the message's mailbox goes on its scope's suppression list (reason `provider`, for
-- `expiry_seconds`), as the events of a service that refuses later would put it there.
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[],
                %(error_classes)s::text[])
        AS d(id, token, error, error_class)
),
settled AS (
    DELETE FROM {schema}.queue AS q
    USING d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.leased_by, d.token, d.error, d.error_class
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, error_class,
         error)
    SELECT id, bucket, kind, 'suppressed', coalesce(%(now)s::timestamptz, now()), attempts,
           token, leased_by, error_class, error
    FROM settled
),
listed AS (
    INSERT INTO {schema}.suppressions AS x
        (scope, recipient_key, reason, detail, created_at, expires_at)
    SELECT DISTINCT ON (coalesce(o.scope, 'default'), o.recipient_key)
           coalesce(o.scope, 'default'), o.recipient_key, 'provider', s.error_class,
           coalesce(%(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(expiry_seconds)s)
    FROM settled AS s
    JOIN {schema}.outbox AS o ON o.id = s.id AND o.bucket = s.bucket
    WHERE o.recipient_key IS NOT NULL
    -- include: longer_suppression_wins
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, error_class,
         error)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s, d.error_class, d.error
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: reserve_tokens
-- Reserve `count` tokens of a provider account's quota; creates the account's row on first use.
-- The row's lock orders the reservations of every worker: the first token is due at the
-- account's `next_at`, but never before its pause ends, nor earlier than the bucket's credit
-- allows (`burst` tokens at most may be due at once); token k is due `k / rate` seconds after
-- the first. `rate` and `burst` are the caller's (the latest worker's settings win). The time
-- is read once the row is locked (`clock_timestamp()`, not the statement's start, which may be
-- a wait for the lock earlier), and returned, so that the caller can place the due times on
-- its own clock.
INSERT INTO {schema}.quotas AS a (account, rate, burst, next_at, updated_at)
SELECT %(account)s, %(rate)s, %(burst)s,
       t.now - make_interval(secs => (%(burst)s - 1) / %(rate)s)
             + make_interval(secs => %(count)s / %(rate)s),
       t.now
FROM (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now) AS t
ON CONFLICT (account) DO UPDATE
SET next_at = greatest(a.next_at,
                       coalesce(%(now)s::timestamptz, clock_timestamp())
                           - make_interval(secs => (excluded.burst - 1) / excluded.rate),
                       coalesce(a.paused_until, '-infinity'))
              + make_interval(secs => %(count)s / excluded.rate),
    rate = excluded.rate,
    burst = excluded.burst,
    updated_at = coalesce(%(now)s::timestamptz, clock_timestamp())
RETURNING a.next_at - make_interval(secs => %(count)s / a.rate) AS first_at,
          a.paused_until, a.updated_at AS now;

-- name: pause_quota
-- Pause a provider account's quota until `seconds` from now (a rate-limit reset the provider
-- gave), unless it is paused longer already, and tell the other workers (NOTIFY).
WITH paused AS (
    UPDATE {schema}.quotas AS a
    SET paused_until = greatest(coalesce(a.paused_until, '-infinity'),
                                coalesce(%(now)s::timestamptz, now())
                                    + make_interval(secs => %(seconds)s)),
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE a.account = %(account)s
    RETURNING a.account, a.paused_until
)
SELECT p.paused_until,
       pg_notify(%(channel)s, %(notice_prefix)s || extract(epoch FROM p.paused_until)::text
                              || %(separator)s || p.account) AS notified
FROM paused AS p;

-- fragment: longer_suppression_wins
-- An entry written over a mailbox's entry replaces it when it lasts longer (no expiry is the
-- longest) or the old one has run out; otherwise the old one stays as it is. The inserting
-- statement names the table `x`.
ON CONFLICT (scope, recipient_key) DO UPDATE
SET reason = excluded.reason,
    detail = excluded.detail,
    event_id = excluded.event_id,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at
WHERE x.expires_at IS NOT NULL
  AND (excluded.expires_at IS NULL OR excluded.expires_at > x.expires_at
       OR x.expires_at <= excluded.created_at)

-- name: find_suppression
-- The unexpired suppression-list entry of a mailbox in a scope, if any.
SELECT reason, detail, created_at, expires_at
FROM {schema}.suppressions
WHERE scope = %(scope)s AND recipient_key = %(recipient_key)s
  AND (expires_at IS NULL OR expires_at > coalesce(%(now)s::timestamptz, now()));

-- name: lift_suppression
-- Take a mailbox off a scope's suppression list; the entry's reason, if there was one.
DELETE FROM {schema}.suppressions
WHERE scope = %(scope)s AND recipient_key = %(recipient_key)s
RETURNING reason;

-- name: add_suppressions
-- Put mailboxes on suppression lists by a person's decision, replacing their entries; how many.
-- The arrays give one entry each; the last entry of a (scope, mailbox) given twice wins.
WITH given AS (
    SELECT DISTINCT ON (g.scope, g.recipient_key) g.*
    FROM unnest(%(scopes)s::text[], %(recipient_keys)s::text[], %(reasons)s::text[],
                %(details)s::text[], %(expires_at)s::timestamptz[])
         WITH ORDINALITY AS g(scope, recipient_key, reason, detail, expires_at, n)
    ORDER BY g.scope, g.recipient_key, g.n DESC
),
written AS (
    INSERT INTO {schema}.suppressions AS x
        (scope, recipient_key, reason, detail, created_at, expires_at)
    SELECT scope, recipient_key, reason, detail, coalesce(%(now)s::timestamptz, now()),
           expires_at
    FROM given
    ON CONFLICT (scope, recipient_key) DO UPDATE
    SET reason = excluded.reason,
        detail = excluded.detail,
        event_id = NULL,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    RETURNING 1
)
SELECT count(*) FROM written;

-- name: list_suppressions
-- Suppression-list entries matching a selection, newest first (expired ones only if asked).
SELECT scope, recipient_key, reason, detail, event_id, created_at, expires_at
FROM {schema}.suppressions
WHERE (%(scope)s::text IS NULL OR scope = %(scope)s::text)
  AND (%(recipient_key)s::text IS NULL OR recipient_key = %(recipient_key)s::text)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
  AND (%(expired)s::boolean OR expires_at IS NULL
       OR expires_at > coalesce(%(now)s::timestamptz, now()))
ORDER BY created_at DESC, scope, recipient_key
LIMIT %(limit)s;

-- name: extend_leases
-- Push the expiry of leases still held to now plus the lease length.
UPDATE {schema}.queue AS q
SET lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + make_interval(secs => %(lease_seconds)s),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
WHERE q.id = d.id AND q.lease_token = d.token
RETURNING q.id, q.lease_expires_at;

-- name: release_leases
-- Give rows back unsent and ready at once, undoing the claim's attempt, with their history.
-- `released` records the attempt given back (a processing row has counted at least one).
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
),
settled AS (
    UPDATE {schema}.queue AS q
    SET status = 'pending',
        available_at = coalesce(%(now)s::timestamptz, now()),
        attempts = greatest(q.attempts - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM d
    -- include: held_by_the_batch
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.leased_by, d.token
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id)
    SELECT id, bucket, kind, 'released', coalesce(%(now)s::timestamptz, now()), attempts + 1,
           token, leased_by
    FROM settled
),
lost AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id)
    SELECT d.id, l.bucket, l.kind, 'lease_lost', coalesce(%(now)s::timestamptz, now()),
           l.attempt, d.token, %(worker_id)s
    -- include: lost_leases
)
SELECT id FROM settled;

-- name: reclaim_expired_leases
-- Take back rows whose lease ran out; out of attempts they become dead. With their history.
-- `expired` locks each row and reads its lease (token, expiry, holder) before the UPDATE
-- clears it, so that the history's `lease_expired` row names the lease that ran out.
WITH expired AS (
    SELECT id, lease_token, lease_expires_at, leased_by
    FROM {schema}.queue
    WHERE status = 'processing'
      AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reclaimed AS (
    UPDATE {schema}.queue AS q
    SET status = CASE WHEN q.attempts >= coalesce(q.max_attempts, %(default_max_attempts)s)
                      THEN 'dead' ELSE 'pending' END,
        dead_reason = CASE WHEN q.attempts >= coalesce(q.max_attempts, %(default_max_attempts)s)
                           THEN 'attempts_exhausted' END,
        available_at = coalesce(%(now)s::timestamptz, now()),
        last_error = 'lease expired while held by ' || coalesce(q.leased_by, 'unknown worker'),
        last_error_class = 'lease_expired',
        lease_token = NULL,
        lease_expires_at = NULL,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM expired
    WHERE q.id = ANY(ARRAY(SELECT id FROM expired)) AND q.id = expired.id
    RETURNING q.id, q.bucket, q.kind, q.status, q.attempts, q.dead_reason, expired.lease_token,
              expired.lease_expires_at, expired.leased_by
),
logged AS (
    INSERT INTO {schema}.history
        (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, lease_expires_at,
         dead_reason)
    SELECT id, bucket, kind, 'lease_expired', coalesce(%(now)s::timestamptz, now()), attempts,
           lease_token, leased_by, lease_expires_at, dead_reason
    FROM reclaimed
)
SELECT id, kind, status FROM reclaimed;

-- name: dead_letter_expired
-- Dead-letter pending rows past their expires_at (reason expired), with their history.
WITH expired AS (
    SELECT id
    FROM {schema}.queue
    WHERE status = 'pending'
      AND expires_at IS NOT NULL
      AND expires_at < coalesce(%(now)s::timestamptz, now())
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
dead AS (
    UPDATE {schema}.queue AS q
    SET status = 'dead',
        dead_reason = 'expired',
        last_error = 'expired before it could be sent',
        last_error_class = 'expired',
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE q.id = ANY(ARRAY(SELECT id FROM expired))
    RETURNING q.id, q.bucket, q.kind, q.attempts, q.dead_reason
),
logged AS (
    INSERT INTO {schema}.history (outbox_id, bucket, kind, event, at, attempt, dead_reason)
    SELECT id, bucket, kind, 'expired', coalesce(%(now)s::timestamptz, now()), attempts,
           dead_reason
    FROM dead
)
SELECT id, kind FROM dead;

-- fragment: dead_letter_selection
-- The filters of `leasebox dead-letters` and `leasebox web`: kinds, reason, error class, age
-- (dead for longer than, dead for less than) and ids, each optional.
status = 'dead'
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
  AND (%(reason)s::text IS NULL OR dead_reason = %(reason)s::text)
  AND (%(error_class)s::text IS NULL OR last_error_class = %(error_class)s::text)
  AND (%(older_than_seconds)s::float8 IS NULL
       OR updated_at < now() - make_interval(secs => %(older_than_seconds)s::float8))
  AND (%(newer_than_seconds)s::float8 IS NULL
       OR updated_at >= now() - make_interval(secs => %(newer_than_seconds)s::float8))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))

-- name: list_dead_letters
-- Dead letters matching a selection, oldest first, without content.
SELECT id, kind, aggregate_id, delivery_key, attempts, max_attempts, dead_reason,
       last_error_class, last_error, created_at, updated_at
FROM {schema}.queue
WHERE
-- include: dead_letter_selection
ORDER BY updated_at, id
LIMIT %(limit)s;

-- name: requeue_dead_letters
-- Make matching dead letters pending again with a fresh attempt budget, with their history.
WITH chosen AS (
    SELECT id FROM {schema}.queue
    WHERE
    -- include: dead_letter_selection
    ORDER BY updated_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
requeued AS (
    UPDATE {schema}.queue AS q
    SET status = 'pending',
        attempts = 0,
        available_at = now(),
        dead_reason = NULL,
        expires_at = CASE WHEN %(clear_expiry)s THEN NULL ELSE q.expires_at END,
        updated_at = now()
    WHERE q.id = ANY(ARRAY(SELECT id FROM chosen))
    RETURNING q.id, q.bucket, q.kind
),
logged AS (
    INSERT INTO {schema}.history (outbox_id, bucket, kind, event, at)
    SELECT id, bucket, kind, 'requeued', now() FROM requeued
)
SELECT id FROM requeued;

-- name: count_dead_letters
-- How many dead letters match a selection.
SELECT count(*)
FROM {schema}.queue
WHERE
-- include: dead_letter_selection

-- name: purge_dead_letters
-- Delete one batch of dead letters matching a selection: the message, its history, receipts.
WITH doomed AS (
    SELECT id FROM {schema}.queue
    WHERE
    -- include: dead_letter_selection
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM {schema}.queue AS q WHERE q.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING q.id, q.bucket
),
message AS (
    DELETE FROM {schema}.outbox AS o USING deleted
    WHERE o.id = deleted.id AND o.bucket = deleted.bucket
),
forgotten AS (
    DELETE FROM {schema}.history AS h USING deleted
    WHERE h.outbox_id = deleted.id AND h.bucket = deleted.bucket
),
unreceipted AS (
    DELETE FROM {schema}.receipts AS r USING deleted WHERE r.outbox_id = deleted.id
)
SELECT id FROM deleted;

-- name: kept_messages
-- The messages of the days before `before` that retention must keep: still in the queue
-- (unsent or dead), or named by a live receipt (a retried request must still map onto it).
-- A receipt made for a message older than its own day before is in `receipts_late_idx`;
-- every other live receipt names a message of yesterday or later, which a retention of a
-- day or more never reaches.
SELECT id FROM {schema}.queue WHERE bucket < %(before)s
UNION
SELECT outbox_id FROM {schema}.receipts
WHERE outbox_bucket < bucket - 1 AND outbox_bucket < %(before)s AND expires_at > now();

-- name: kept_messages_short_retention
-- `kept_messages` for a retention under a day, which reaches yesterday: every live receipt.
SELECT id FROM {schema}.queue WHERE bucket < %(before)s
UNION
SELECT outbox_id FROM {schema}.receipts
WHERE bucket >= (now() AT TIME ZONE 'UTC')::date
  AND outbox_bucket < %(before)s AND expires_at > now();

-- name: keep_messages
-- Move still wanted messages of the days before `before` to the kept partition, once.
-- Their outbox, queue and history rows get the bucket `day` (9999-12-31, the kept partition,
-- which retention never drops) and their receipts point there: retention is about to drop
-- the days they were in. It runs beside the producers and workers, taking row locks only: a
-- message whose queue row another transaction holds right now (a worker settling it) is left
-- for a later try. The answer is how many messages moved and how many were left.
WITH ids AS (
    SELECT unnest(%(ids)s::bigint[]) AS id
),
held AS MATERIALIZED (
    SELECT q.id FROM {schema}.queue AS q
    WHERE q.id = ANY(%(ids)s::bigint[]) AND q.bucket < %(before)s
    ORDER BY q.id
    FOR UPDATE SKIP LOCKED
),
movable AS MATERIALIZED (
    SELECT ids.id FROM ids
    WHERE ids.id IN (SELECT id FROM held)
       OR NOT EXISTS (SELECT FROM {schema}.queue AS q
                      WHERE q.id = ids.id AND q.bucket < %(before)s)
),
queued AS (
    UPDATE {schema}.queue AS q SET bucket = %(day)s
    FROM held WHERE q.id = held.id
),
messages AS (
    UPDATE {schema}.outbox AS o SET bucket = %(day)s
    FROM movable WHERE o.id = movable.id AND o.bucket < %(before)s
    RETURNING o.id
),
history AS (
    UPDATE {schema}.history AS h SET bucket = %(day)s
    FROM movable WHERE h.outbox_id = movable.id AND h.bucket < %(before)s
),
receipts AS (
    UPDATE {schema}.receipts AS r SET outbox_bucket = %(day)s
    FROM movable WHERE r.outbox_id = movable.id AND r.outbox_bucket < %(before)s
)
SELECT (SELECT count(*) FROM messages) AS moved,
       (SELECT count(*) FROM ids) - (SELECT count(*) FROM movable) AS left_behind;

-- name: forget_kept_messages
-- Delete a batch of kept messages that nothing wants any more, with their history.
-- A message of the kept partition (`kept`) goes once it is out of the queue (sent, or purged),
-- no live receipt names it, and nothing happened to it since `since` (now minus the
-- retention): as a message of a day would have gone with its day.
WITH doomed AS (
    SELECT o.id FROM {schema}.outbox AS o
    WHERE o.bucket = %(kept)s AND o.created_at < %(since)s
      AND NOT EXISTS (SELECT FROM {schema}.queue AS q WHERE q.id = o.id)
      AND NOT EXISTS (SELECT FROM {schema}.receipts AS r
                      WHERE r.outbox_id = o.id AND r.expires_at > now()
                        AND r.bucket >= (now() AT TIME ZONE 'UTC')::date)
      AND NOT EXISTS (SELECT FROM {schema}.history AS h
                      WHERE h.outbox_id = o.id AND h.bucket = o.bucket AND h.at >= %(since)s)
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
),
forgotten AS (
    DELETE FROM {schema}.history AS h USING doomed
    WHERE h.outbox_id = doomed.id AND h.bucket = %(kept)s
),
gone AS (
    DELETE FROM {schema}.outbox AS o USING doomed
    WHERE o.id = doomed.id AND o.bucket = %(kept)s
    RETURNING o.id
)
SELECT count(*) FROM gone;

-- name: forget_guard_subjects
-- Delete a batch of the abuse guard's subjects that no send touched since `since`.
-- A subject's row matters only while transactions that counted it are open. The age is
-- checked again on the row itself, so a row a send touches meanwhile stays.
DELETE FROM {schema}.guard_subjects AS g
WHERE g.subject IN (SELECT subject FROM {schema}.guard_subjects
                    WHERE touched_at < %(since)s LIMIT %(limit)s)
  AND g.touched_at < %(since)s;

-- name: listen
-- Subscribe to the queue's insert notifications.
LISTEN {notify_channel_name};

-- name: schema_present
-- Whether the schema's tables exist.
SELECT count(*) = 4 FROM pg_catalog.pg_tables
WHERE schemaname = %(schema_name)s AND tablename IN ('outbox', 'queue', 'receipts', 'history');

-- name: schema_version
-- The newest migration applied to the schema (the operator and the worker compare it with theirs).
SELECT coalesce(max(version), 0) FROM {schema}.schema_migrations;

-- name: record_events
-- Store a request's provider events once each, link them to their messages, list mailboxes and count the hour.
-- `token` (Mailgun's signed token, else NULL) is remembered first: a token already seen is
-- a replay, and then nothing else happens (`fresh` false). Each event is linked to the sent
-- message whose `sent` history row records its provider message id (`<id>` too: some
-- services wrap it), and stored unless an event with the same key is already there (a
-- service redelivers an event with a new event id of its own: the key is what the event
-- is). Only new events count: a complaint lists the mailbox for good in its message's scope,
-- a hard bounce for `hard_bounce_seconds`, the service's own suppression for
-- `provider_seconds`, and the `soft_bounce_limit`-th soft bounce of a mailbox within
-- `soft_bounce_window_seconds` for `soft_bounce_seconds`. An event of an unknown message is
-- stored unlinked and lists nothing (it has no scope). The answer is one row per new event
-- (or a single row of NULLs but `fresh`), with whether it was linked and the reason it
-- listed its mailbox with, if it did.
WITH token AS (
    INSERT INTO {schema}.feedback_tokens (provider, token, seen_at)
    SELECT %(provider)s, %(token)s::text, coalesce(%(now)s::timestamptz, now())
    WHERE %(token)s::text IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING 1
),
fresh AS (
    SELECT %(token)s::text IS NULL OR EXISTS (SELECT FROM token) AS ok
),
forgotten AS (
    DELETE FROM {schema}.feedback_tokens
    WHERE %(token)s::text IS NOT NULL
      AND seen_at < coalesce(%(now)s::timestamptz, now())
                    - make_interval(secs => %(token_seconds)s)
),
input AS (
    SELECT i.*
    FROM unnest(%(provider_message_ids)s::text[], %(recipient_keys)s::text[],
                %(events)s::text[], %(occurred_at)s::timestamptz[], %(bounce_classes)s::text[],
                %(smtp_statuses)s::text[], %(details)s::text[], %(sending_domains)s::text[])
         AS i(provider_message_id, recipient_key, event, occurred_at, bounce_class,
              smtp_status, detail, sending_domain)
    WHERE (SELECT ok FROM fresh)
),
linked AS (
    SELECT i.*, m.id AS outbox_id, m.scope, m.kind
    FROM input AS i
    LEFT JOIN LATERAL (
        SELECT o.id, coalesce(o.scope, 'default') AS scope, o.kind
        FROM {schema}.history AS h
        JOIN {schema}.outbox AS o ON o.id = h.outbox_id AND o.bucket = h.bucket
        WHERE h.event = 'sent' AND h.provider_message_id IS NOT NULL
          AND h.provider_message_id IN (i.provider_message_id,
                                        '<' || i.provider_message_id || '>')
        ORDER BY h.id DESC
        LIMIT 1
    ) AS m ON true
),
inserted AS (
    INSERT INTO {schema}.events
        (provider, provider_message_id, recipient_key, event, occurred_at, bounce_class,
         smtp_status, detail, sending_domain, outbox_id, scope, kind, received_at)
    SELECT %(provider)s, provider_message_id, recipient_key, event, occurred_at, bounce_class,
           smtp_status, detail, sending_domain, outbox_id, scope, kind,
           coalesce(%(now)s::timestamptz, now())
    FROM linked
    ON CONFLICT (provider, provider_message_id, recipient_key, event, occurred_at) DO NOTHING
    RETURNING id, provider_message_id, recipient_key, event, occurred_at, bounce_class,
              smtp_status, sending_domain, outbox_id, scope, kind
),
soft AS (
    SELECT n.scope, n.recipient_key, max(n.id) AS event_id,
           count(*) + (
               SELECT count(*) FROM {schema}.events AS e
               WHERE e.recipient_key = n.recipient_key AND e.event = 'bounced'
                 AND e.bounce_class = 'soft'
                 AND e.occurred_at > coalesce(%(now)s::timestamptz, now())
                                     - make_interval(secs => %(soft_bounce_window_seconds)s)
           ) AS seen
    FROM inserted AS n
    WHERE n.scope IS NOT NULL AND n.event = 'bounced' AND n.bounce_class = 'soft'
      AND n.occurred_at > coalesce(%(now)s::timestamptz, now())
                          - make_interval(secs => %(soft_bounce_window_seconds)s)
    GROUP BY n.scope, n.recipient_key
),
verdicts AS (
    SELECT n.scope, n.recipient_key, n.id AS event_id,
           CASE n.event WHEN 'complained' THEN 'complaint' WHEN 'suppressed' THEN 'provider'
                ELSE 'hard_bounce' END AS reason,
           coalesce(n.smtp_status, n.event) AS detail,
           CASE n.event
               WHEN 'complained' THEN NULL
               WHEN 'suppressed' THEN coalesce(%(now)s::timestamptz, now())
                                      + make_interval(secs => %(provider_seconds)s)
               ELSE coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => %(hard_bounce_seconds)s)
           END AS expires_at
    FROM inserted AS n
    WHERE n.scope IS NOT NULL
      AND (n.event IN ('complained', 'suppressed')
           OR (n.event = 'bounced' AND n.bounce_class = 'hard'))
    UNION ALL
    SELECT s.scope, s.recipient_key, s.event_id, 'soft_bounces', s.seen || ' soft bounces',
           coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(soft_bounce_seconds)s)
    FROM soft AS s
    WHERE s.seen >= %(soft_bounce_limit)s
),
listed AS (
    INSERT INTO {schema}.suppressions AS x
        (scope, recipient_key, reason, detail, event_id, created_at, expires_at)
    SELECT DISTINCT ON (v.scope, v.recipient_key)
           v.scope, v.recipient_key, v.reason, v.detail, v.event_id,
           coalesce(%(now)s::timestamptz, now()), v.expires_at
    FROM verdicts AS v
    ORDER BY v.scope, v.recipient_key, v.expires_at DESC NULLS FIRST
    -- include: longer_suppression_wins
    RETURNING x.scope, x.recipient_key, x.reason
),
counted AS (
    INSERT INTO {schema}.feedback_hours AS f
        (hour, provider, sending_domain, kind, outcome, events)
    SELECT date_trunc('hour', coalesce(%(now)s::timestamptz, now())), %(provider)s,
           n.sending_domain, coalesce(n.kind, ''),
           CASE WHEN n.event = 'bounced' THEN 'bounced_' || coalesce(n.bounce_class, 'soft')
                ELSE n.event END AS outcome,
           count(*)
    FROM inserted AS n
    GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (hour, provider, sending_domain, kind, outcome)
    DO UPDATE SET events = f.events + excluded.events
)
SELECT f.ok AS fresh, n.provider_message_id, n.recipient_key, n.event, n.occurred_at,
       n.outbox_id IS NOT NULL AS linked, l.reason AS listed
FROM fresh AS f
LEFT JOIN inserted AS n ON true
LEFT JOIN listed AS l ON l.scope = n.scope AND l.recipient_key = n.recipient_key;

-- name: reputation
-- A pool's providers' event counts in the last day and week (the operator's reputation check).
-- The providers are those that reported on the pool's kinds in the last week; each is
-- counted over every kind it sent, since a provider judges the whole account.
WITH mine AS (
    SELECT DISTINCT provider FROM {schema}.feedback_hours
    WHERE kind = ANY(%(kinds)s::text[])
      AND hour >= date_trunc('hour', now()) - interval '7 days'
)
SELECT h.provider,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'delivered'
                                        AND h.hour >= date_trunc('hour', now())
                                                      - interval '23 hours'), 0) AS delivered_1d,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'bounced_hard'
                                        AND h.hour >= date_trunc('hour', now())
                                                      - interval '23 hours'), 0) AS bounced_1d,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'complained'
                                        AND h.hour >= date_trunc('hour', now())
                                                      - interval '23 hours'), 0) AS complained_1d,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'delivered'), 0) AS delivered_7d,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'bounced_hard'), 0) AS bounced_7d,
       coalesce(sum(h.events) FILTER (WHERE h.outcome = 'complained'), 0) AS complained_7d
FROM {schema}.feedback_hours AS h
WHERE h.provider IN (SELECT provider FROM mine)
  AND h.hour >= date_trunc('hour', now()) - interval '7 days'
GROUP BY h.provider
ORDER BY h.provider;

-- name: prune_events
-- Delete a batch of provider events received before a day, and the hourly counts older than it and than the reputation's week.
WITH doomed AS (
    SELECT id FROM {schema}.events
    WHERE received_at < %(before)s::date
    ORDER BY received_at
    LIMIT %(limit)s
),
deleted AS (
    DELETE FROM {schema}.events AS e USING doomed WHERE e.id = doomed.id
    RETURNING 1
),
hours AS (
    DELETE FROM {schema}.feedback_hours
    WHERE hour < least(%(before)s::date, (now() - interval '8 days')::date)
)
SELECT count(*) FROM deleted;
