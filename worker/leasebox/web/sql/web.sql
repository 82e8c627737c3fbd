-- Named queries of `leasebox web`: what the overview reads beside the backlog, the choices of
-- the dead-letter filters, and the audit trail. `{schema}` is the leasebox schema. None of
-- these serve a worker: a person's page load runs each once. The windows read the history
-- partitions of the messages created at most a day before the window (as the backlog's send
-- rate does), through the partial indexes of sends and of failures.

-- name: recent_sends
-- Sends per kind in the window (the partial index of `sent` events).
SELECT h.kind, count(*) AS sent
FROM {schema}.history AS h
WHERE h.event = 'sent'
  AND h.at > now() - make_interval(secs => %(window_seconds)s)
  AND h.bucket >= ((now() - make_interval(secs => %(window_seconds)s) - interval '1 day')
                   AT TIME ZONE 'UTC')::date
  AND h.bucket <= (now() AT TIME ZONE 'UTC')::date
GROUP BY h.kind
ORDER BY h.kind;

-- name: recent_failures
-- Failed attempts per kind, event and error class in the window (the index of failures).
SELECT h.kind, h.event, coalesce(h.error_class, '') AS error_class, count(*) AS events
FROM {schema}.history AS h
WHERE h.event IN ('retry', 'ambiguous', 'dead', 'lease_lost', 'lease_expired')
  AND h.at > now() - make_interval(secs => %(window_seconds)s)
  AND h.bucket >= ((now() - make_interval(secs => %(window_seconds)s) - interval '1 day')
                   AT TIME ZONE 'UTC')::date
  AND h.bucket <= (now() AT TIME ZONE 'UTC')::date
GROUP BY h.kind, h.event, h.error_class
ORDER BY h.kind, count(*) DESC;

-- name: dead_letter_choices
-- The kinds, reasons and error classes the dead letters have, for the filters' lists.
SELECT array_agg(DISTINCT kind ORDER BY kind) AS kinds,
       array_agg(DISTINCT dead_reason ORDER BY dead_reason)
           FILTER (WHERE dead_reason IS NOT NULL) AS reasons,
       array_agg(DISTINCT last_error_class ORDER BY last_error_class)
           FILTER (WHERE last_error_class IS NOT NULL) AS error_classes
FROM {schema}.queue
WHERE status = 'dead';

-- name: record_action
-- Write one row of the audit trail: who asked for which action on what, and what came of it.
INSERT INTO {schema}.audit (actor, action, outcome, selection, affected, detail)
VALUES (%(actor)s, %(action)s, %(outcome)s, %(selection)s, %(affected)s, %(detail)s)
RETURNING id, at;

-- name: list_actions
-- The latest rows of the audit trail, newest first.
SELECT id, at, actor, action, outcome, selection, affected, detail
FROM {schema}.audit
ORDER BY at DESC, id DESC
LIMIT %(limit)s;
