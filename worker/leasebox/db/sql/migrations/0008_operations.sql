-- 0008: the audit trail of what people did through `leasebox web`, and an index of failures.
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
