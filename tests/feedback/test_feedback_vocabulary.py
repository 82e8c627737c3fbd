"""Each service's words mapped onto leasebox's six events, and the receivers' settings read
from the environment: what the HTTP tests do not vary."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from leasebox.feedback import mailgun, postmark, resend, sendgrid, sns
from leasebox.feedback.events import BadPayload, EventType
from leasebox.feedback.receiver import Receivers
from leasebox.feedback.sns import SnsMessage
from support.mail_webhooks import MailgunSigner, PostmarkCredentials, SendGridSigner, SnsSigner

AT = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def kinds(events: list[Any]) -> list[tuple[str, str | None, str | None]]:
    return [(e.type.value, e.bounce_class, e.smtp_status) for e in events]


def ses(event: dict[str, Any]) -> list[Any]:
    return sns.parse(SnsMessage("Notification", "eu-west-1", {"Message": json.dumps(event)}))


def test_ses_transient_bounces_are_soft_and_its_suppression_list_is_the_providers() -> None:
    transient = SnsSigner.bounce("m1", "a@x.org", AT)
    transient["bounce"].update(bounceType="Transient", bounceSubType="MailboxFull")
    transient["bounce"]["bouncedRecipients"][0]["status"] = "4.2.2"
    listed = SnsSigner.bounce("m1", "a@x.org", AT, subtype="OnAccountSuppressionList")
    delay = {
        "eventType": "DeliveryDelay",
        "mail": {"messageId": "m1", "source": "Acme <no-reply@mail.x.org>"},
        "deliveryDelay": {"timestamp": AT.isoformat(), "delayType": "MailboxFull",
                          "delayedRecipients": [{"emailAddress": "a@x.org", "status": "4.2.2"}]},
    }  # fmt: skip
    assert kinds(ses(transient)) == [("bounced", "soft", "4.2.2")]
    assert kinds(ses(listed)) == [("suppressed", None, "5.1.1")]
    [deferred] = ses(delay)
    assert (deferred.type, deferred.sending_domain) == (EventType.DEFERRED, "mail.x.org")
    assert ses({"eventType": "Open", "mail": {"messageId": "m1"}}) == []


def test_sendgrid_blocked_is_soft_and_a_dropped_bounced_address_is_suppressed() -> None:
    batch = [
        SendGridSigner.event("bounce", "sg1", "a@x.org", AT, type="blocked", status="4.7.1"),
        SendGridSigner.event("dropped", "sg1", "a@x.org", AT, reason="Bounced Address"),
        SendGridSigner.event("dropped", "sg1", "a@x.org", AT, reason="Invalid SMTPAPI header"),
        SendGridSigner.event("spamreport", "sg1", "a@x.org", AT),
        SendGridSigner.event("open", "sg1", "a@x.org", AT),
    ]
    events = sendgrid.parse(json.dumps(batch).encode())
    assert kinds(events) == [
        ("bounced", "soft", "4.7.1"),
        ("suppressed", None, None),
        ("rejected", None, None),
        ("complained", None, None),
    ]
    assert {e.provider_message_id for e in events} == {"sg1"}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("HardBounce", ("bounced", "hard")),
        ("SoftBounce", ("bounced", "soft")),
        ("Transient", ("deferred", None)),
        ("SpamComplaint", ("complained", None)),
        ("ManuallyDeactivated", ("suppressed", None)),
        ("AutoResponder", None),
    ],
)
def test_postmark_bounce_types(kind: str, expected: tuple[str, str | None] | None) -> None:
    _, body = PostmarkCredentials().request(PostmarkCredentials.bounce("pm", "a@x.org", AT, kind))
    events = postmark.parse(body)
    assert [(e.type.value, e.bounce_class) for e in events] == ([expected] if expected else [])


def test_mailgun_temporary_failures_defer_and_its_suppressions_are_the_providers() -> None:
    temporary = MailgunSigner.failed("<mg1@x.org>", "a@x.org", AT, severity="temporary")
    suppressed = {**MailgunSigner.failed("mg1@x.org", "a@x.org", AT), "reason": "suppress-bounce"}
    assert kinds(mailgun.parse(json.dumps({"event-data": temporary}).encode())) == [
        ("deferred", None, "4.2.2")
    ]
    [event] = mailgun.parse(json.dumps({"event-data": suppressed}).encode())
    assert (event.type, event.provider_message_id) == (EventType.SUPPRESSED, "mg1@x.org")


def test_resend_names_every_recipient_and_refuses_an_event_without_one() -> None:
    event = {"type": "email.complained", "created_at": AT.isoformat(),
             "data": {"email_id": "re1", "to": ["a@x.org", "B <b@x.org>"]}}  # fmt: skip
    assert [e.recipient for e in resend.parse(json.dumps(event).encode())] == ["a@x.org", "b@x.org"]
    with pytest.raises(BadPayload):
        resend.parse(json.dumps({**event, "data": {"email_id": "re1"}}).encode())


def test_the_receivers_read_their_secrets_and_rules_from_the_environment() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    env = {
        "LEASEBOX_FEEDBACK_SES_TOPIC_ARNS": "arn:aws:sns:eu-west-1:1:a, arn:aws:sns:eu-west-1:1:b",
        "LEASEBOX_FEEDBACK_SENDGRID_PUBLIC_KEYS": SendGridSigner().public_key,
        "LEASEBOX_FEEDBACK_POSTMARK_CREDENTIALS": "hooks:pa:ss,old:word",
        "LEASEBOX_FEEDBACK_MAILGUN_SIGNING_KEYS": "k1,k2",
        "LEASEBOX_FEEDBACK_RESEND_SECRETS": secret,
        "LEASEBOX_FEEDBACK_HARD_BOUNCE_DAYS": "30",
        "LEASEBOX_FEEDBACK_SOFT_BOUNCE_LIMIT": "5",
    }
    receivers = Receivers.from_env(env)
    assert receivers.served == ["ses", "sendgrid", "postmark", "mailgun", "resend"]
    assert receivers.postmark is not None
    assert receivers.postmark.credentials == (("hooks", "pa:ss"), ("old", "word"))
    assert (receivers.rules.hard_bounce_seconds, receivers.rules.soft_bounce_limit) == (
        30 * 86400,
        5,
    )
    assert Receivers.from_env({}).served == []
    with pytest.raises(ValueError, match="LEASEBOX_FEEDBACK_SOFT_BOUNCE_LIMIT"):
        Receivers.from_env({"LEASEBOX_FEEDBACK_SOFT_BOUNCE_LIMIT": "many"})
