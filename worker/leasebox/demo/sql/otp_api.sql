-- Named queries of the reference OTP API (`-- name: <name>` starts a query).
-- `{schema}` is the API's own schema (the demo uses `demo`), quoted as an identifier.

-- name: create_challenges
-- Create the reference API's challenges table.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.challenges (
    id uuid PRIMARY KEY,
    outbox_id bigint NOT NULL UNIQUE,
    email text NOT NULL,
    user_id text,
    code_hash text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- name: insert_challenge
-- Record one OTP challenge (the code only as a hash).
INSERT INTO {schema}.challenges (id, outbox_id, email, user_id, code_hash, expires_at)
VALUES (%(id)s, %(outbox_id)s, %(email)s, %(user_id)s, %(code_hash)s, %(expires_at)s);

-- name: find_challenge_by_outbox
-- The challenge an outbox row belongs to (a retried request's).
SELECT id, expires_at FROM {schema}.challenges WHERE outbox_id = %(outbox_id)s;

-- name: get_challenge
-- One challenge by id.
SELECT id, outbox_id, created_at, expires_at FROM {schema}.challenges WHERE id = %(id)s;

-- name: list_challenges
-- Every challenge, for the demo's audit.
SELECT id, outbox_id, code_hash FROM {schema}.challenges;
