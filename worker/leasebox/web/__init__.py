"""`leasebox web`: one page to look at when the verification SLA alert fires.

A small server-rendered application (aiohttp and Jinja2, no JavaScript at all): an overview
of every kind's backlog against its SLA, its send and failure rates and the alert conditions
that hold now; the dead letters, filtered; each message's story as `leasebox trace` tells it;
and the audit trail of what people did. It is read-only by default; requeue and purge need
`--allow-actions` and a viewer with the operator role, a CSRF-protected POST, and leave a row
in the audit table whether they were done or refused. It never shows a message's data,
secrets, code or body, and masks recipients from viewers without the operator role.
"""
