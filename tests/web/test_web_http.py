"""`leasebox web` over HTTP on a real outbox: pages, filters, roles, CSRF, the audit trail.

The outbox is filled by a real worker process (`support.web_rig`); the server runs on
loopback and is spoken to with plain HTTP requests, the way a browser or `curl` would,
with the user and groups headers of an authenticating proxy. The browser's own view is in
`test_web_browser.py`.
"""

from __future__ import annotations

import html
import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import psycopg
import pytest

from leasebox.web.settings import WebSettings
from support.web_rig import BOUNCING, CODE, RECIPIENT, Seeded, running_web, seeded_outbox

pytestmark = pytest.mark.db
PAGES = ("/", "/dead-letters", "/audit")


@dataclass
class Answer:
    status: int
    text: str


class Browser:
    """A cookie-keeping HTTP client that sends the proxy's identity headers."""

    def __init__(self, base: str, user: str | None = None, groups: str = "") -> None:
        self.base = base
        self.headers = {} if user is None else {"X-Forwarded-User": user}
        if groups:
            self.headers["X-Forwarded-Groups"] = groups
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
            _NoRedirects(),
        )

    def request(self, path: str, form: dict[str, str] | None = None) -> Answer:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers)
        try:
            with self.opener.open(request, timeout=30) as response:
                return Answer(response.status, response.read().decode())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, exc.read().decode())

    def csrf(self, path: str = "/dead-letters") -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]{64})"', self.request(path).text)
        assert found, "the page carries no CSRF token"
        return found.group(1)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def proxy_settings(dsn: str, **overrides: object) -> WebSettings:
    fields: dict[str, object] = {
        "dsn": dsn,
        "auth": "proxy",
        "operator_groups": ("oncall",),
        "allow_actions": True,
        "kind_sla_seconds": {"otp": 10.0},
    }
    fields.update(overrides)
    return WebSettings(**fields).check()  # type: ignore[arg-type]


def test_every_page_renders_the_outbox_and_none_shows_a_code_or_a_recipient(
    web_seeded: tuple[str, Seeded],
) -> None:
    dsn, rows = web_seeded
    with running_web(proxy_settings(dsn)) as base:
        viewer = Browser(base, "grace", "readers")
        pages = {path: viewer.request(path) for path in PAGES}
        for outbox_id in (rows.sent[0], *rows.rejected, rows.invalid, *rows.retrying, rows.stale):
            pages[f"/messages/{outbox_id}"] = viewer.request(f"/messages/{outbox_id}")
    for path, page in pages.items():
        assert page.status == 200, path
        assert CODE not in page.text, path
        assert RECIPIENT not in page.text, path
        assert BOUNCING not in page.text, path
    overview = pages["/"].text
    assert "LeaseboxVerificationSLABreached: otp: the oldest pending message is" in overview
    assert "LeaseboxDeadLettersIncreasing: otp: 2 new dead letters" in overview
    assert "LeaseboxRetryRatioHigh: verification" in overview
    assert "smtp_550" in overview
    letters = pages["/dead-letters"].text
    assert all(f'href="/messages/{i}"' in letters for i in rows.rejected)
    story = pages[f"/messages/{rows.rejected[0]}"].text
    assert "b***@example.com" in story
    assert "rejected" in story
    assert "smtp_550" in story
    assert "1 worker" in story or "one worker" in story


def test_an_operator_sees_recipients_in_full(web_seeded: tuple[str, Seeded]) -> None:
    dsn, rows = web_seeded
    with running_web(proxy_settings(dsn)) as base:
        page = Browser(base, "ada", "oncall").request(f"/messages/{rows.rejected[0]}")
    assert page.status == 200
    assert BOUNCING in page.text
    assert CODE not in page.text


def test_the_filters_narrow_the_dead_letters(web_seeded: tuple[str, Seeded]) -> None:
    dsn, rows = web_seeded
    with running_web(proxy_settings(dsn)) as base:
        viewer = Browser(base, "grace")
        by_kind = viewer.request("/dead-letters?kind=verification").text
        by_class = viewer.request("/dead-letters?error_class=smtp_550&within=1h").text
        nothing = viewer.request("/dead-letters?older_than=1d").text
        bad = viewer.request("/dead-letters?within=soon")
    listed = re.compile(r'<th scope="row"><a href="/messages/(\d+)">')
    assert sorted(int(i) for i in listed.findall(by_kind)) == [rows.rejected[2], rows.invalid]
    assert sorted(int(i) for i in listed.findall(by_class)) == sorted(rows.rejected)
    assert listed.findall(nothing) == []
    assert bad.status == 400
    assert "'soon' is no duration" in html.unescape(bad.text)


def _audit(dsn: str) -> list[tuple[str, str, str, int, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT actor, action, outcome, affected, detail FROM leasebox.audit ORDER BY id"
        ).fetchall()
    return [(str(a), str(b), str(c), int(d), e) for a, b, c, d, e in rows]


def _dead(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM leasebox.queue WHERE status = 'dead'").fetchone()
    return int(row[0]) if row else 0


def test_a_requeue_is_refused_without_the_role_and_audited_with_it(
    db_dsn: str,
) -> None:
    rows = seeded_outbox(db_dsn)
    form = {"kind": "otp", "error_class": "smtp_550"}
    with running_web(proxy_settings(db_dsn)) as base:
        reader = Browser(base, "grace", "readers")
        refused = reader.request("/actions/requeue", {**form, "csrf": reader.csrf()})
        oncall = Browser(base, "ada", "oncall,readers")
        token = oncall.csrf()
        preview = oncall.request("/actions/requeue", {**form, "csrf": token})
        assert _dead(db_dsn) == 4
        done = oncall.request("/actions/requeue", {**form, "csrf": token, "confirm": "yes"})
        audit_page = oncall.request("/audit").text
    assert refused.status == 403
    assert "grace has the viewer role; Requeue needs operator" in refused.text
    assert preview.status == 200
    assert "Requeue 2 dead letters" in preview.text
    assert done.status == 303
    assert _dead(db_dsn) == 2
    with psycopg.connect(db_dsn) as conn:
        statuses = conn.execute(
            "SELECT status FROM leasebox.queue WHERE id = ANY(%s)", (list(rows.rejected[:2]),)
        ).fetchall()
    assert statuses == [("pending",), ("pending",)]
    assert _audit(db_dsn) == [
        ("grace", "requeue", "refused", 0, "grace has the viewer role; Requeue needs operator"),
        ("ada", "requeue", "done", 2, None),
    ]
    assert "ada" in audit_page
    assert "kind=otp, error_class=smtp_550" in audit_page


def test_a_purge_is_previewed_and_needs_a_matching_csrf_token(db_dsn: str) -> None:
    seeded_outbox(db_dsn)
    with running_web(proxy_settings(db_dsn)) as base:
        oncall = Browser(base, "ada", "oncall")
        oncall.csrf()  # the browser has its CSRF cookie, but not the form's token:
        forged = oncall.request("/actions/purge", {"confirm": "yes", "csrf": "0" * 64})
        missing = oncall.request("/actions/purge", {"confirm": "yes"})
        preview = oncall.request("/actions/purge", {"kind": "verification", "csrf": oncall.csrf()})
        done = oncall.request(
            "/actions/purge", {"kind": "verification", "csrf": oncall.csrf(), "confirm": "yes"}
        )
    assert (forged.status, missing.status) == (403, 403)
    assert "CSRF token does not match" in forged.text
    assert "Delete 2 dead letters for good" in preview.text
    assert done.status == 303
    assert _dead(db_dsn) == 2
    assert [row[2] for row in _audit(db_dsn)] == ["refused", "refused", "done"]


def test_the_default_read_only_mode_refuses_every_action(db_dsn: str) -> None:
    seeded_outbox(db_dsn)
    with running_web(proxy_settings(db_dsn, allow_actions=False)) as base:
        oncall = Browser(base, "ada", "oncall")
        page = oncall.request("/dead-letters").text
        refused = oncall.request("/actions/purge", {"csrf": oncall.csrf(), "confirm": "yes"})
    assert "The server runs read-only" in page
    assert refused.status == 403
    assert "read-only" in refused.text
    assert _dead(db_dsn) == 4


def test_a_request_without_an_identity_is_refused(db_dsn: str) -> None:
    token = "t" * 24
    operator = "o" * 24
    settings = WebSettings(dsn=db_dsn, auth="token", viewer_token=token, operator_token=operator)
    with running_web(settings.check()) as base:
        anonymous = Browser(base).request("/")
        wrong = Browser(base)
        wrong.headers["Authorization"] = "Bearer " + "x" * 24
        bearer = Browser(base)
        bearer.headers["Authorization"] = f"Bearer {token}"
        by_form = Browser(base)
        signed_in = by_form.request("/login", {"token": operator})
        after = by_form.request("/")
        health = Browser(base).request("/healthz")
        assert wrong.request("/").status == 401
        assert bearer.request("/").status == 200
    with running_web(proxy_settings(db_dsn)) as base:
        no_user = Browser(base).request("/dead-letters")
    assert anonymous.status == 401
    assert signed_in.status == 303
    assert after.status == 200
    assert "operator token (operator)" in after.text
    assert health.status == 200
    assert no_user.status == 401
