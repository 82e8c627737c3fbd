"""SES through SNS: both signature versions against the certificate served by the topic's
region's SNS host, a topic allowlist checked before anything is fetched, a subscription
confirmed only for an allowed topic, no redirect followed, and the strict host by default."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from leasebox.feedback.certificates import SigningCertificates, sns_host
from leasebox.feedback.signing import Refused
from support.feedback_rig import Hooks, SentMessage, Signers, stored
from support.mail_webhooks import SnsCertificateServer, SnsSigner

OTHER_TOPIC = "arn:aws:sns:eu-west-1:999999999999:someone-elses"


def kept(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return stored(conn, "SELECT event, bounce_class, recipient_key FROM leasebox.events")


@pytest.mark.parametrize("version", ["1", "2"])
async def test_both_signature_versions_verify_against_the_served_certificate(
    now: dt.datetime,
    version: str,
    signers: Signers,
    hooks: Hooks,
    sent: Any,
    db_conn: psycopg.Connection[Any],
) -> None:
    message: SentMessage = sent("0102018c-ses-1")
    bounce = SnsSigner.bounce(message.provider_message_id, message.recipient, now)
    answer = await hooks.post("ses", signers.sns.message(bounce, now, version=version))
    assert (answer.status, answer.text) == (200, "stored 1 of 1")
    assert kept(db_conn) == [("bounced", "hard", "gone@example.org")]


async def test_a_valid_signature_from_a_topic_not_allowed_is_a_forgery_and_fetches_nothing(
    now: dt.datetime,
    signers: Signers,
    hooks: Hooks,
    sns_server: SnsCertificateServer,
    db_conn: psycopg.Connection[Any],
) -> None:
    bounce = SnsSigner.bounce("0102-x", "ada@example.org", now)
    answer = await hooks.post("ses", signers.sns.message(bounce, now, topic=OTHER_TOPIC))
    confirm = await hooks.post(
        "ses", signers.sns.message(None, now, topic=OTHER_TOPIC, kind="SubscriptionConfirmation")
    )
    assert (answer.status, answer.text) == (403, "unknown_topic")
    assert (confirm.status, confirm.text) == (403, "unknown_topic")
    assert sns_server.requests == []
    assert kept(db_conn) == []


async def test_a_subscription_of_an_allowed_topic_is_confirmed(
    now: dt.datetime, signers: Signers, hooks: Hooks, sns_server: SnsCertificateServer
) -> None:
    answer = await hooks.post(
        "ses", signers.sns.message(None, now, kind="SubscriptionConfirmation", version="1")
    )
    assert (answer.status, answer.text) == (200, "subscribed")
    assert sns_server.requests[-1] == "/?Action=ConfirmSubscription"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://sns.eu-west-1.amazonaws.com.evil.example/cert.pem", "untrusted_url"),
        ("http://{host}/SimpleNotificationService-test.pem", "untrusted_url"),
        ("https://{host}/SimpleNotificationService-test.txt", "untrusted_url"),
        ("https://user@{host}/SimpleNotificationService-test.pem", "untrusted_url"),
        ("https://{host}/redirect.pem", "sns_unreachable"),
    ],
)
async def test_a_certificate_anywhere_but_the_regions_sns_host_is_refused(
    now: dt.datetime,
    url: str,
    reason: str,
    signers: Signers,
    hooks: Hooks,
    sns_server: SnsCertificateServer,
    db_conn: psycopg.Connection[Any],
) -> None:
    bounce = SnsSigner.bounce("0102-y", "ada@example.org", now)
    cert_url = url.format(host=sns_server.host)
    answer = await hooks.post("ses", signers.sns.message(bounce, now, cert_url=cert_url))
    assert answer.text == reason
    assert answer.status in (403, 502)
    # The redirect was not followed: the certificate it points to was never asked for.
    assert "/SimpleNotificationService-test.pem" not in sns_server.requests
    assert kept(db_conn) == []


def test_by_default_only_amazons_sns_host_of_the_topics_region_is_trusted() -> None:
    strict = SigningCertificates()
    good = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem"
    assert strict.check_url(good, "eu-west-1", path_suffix=".pem") == good
    assert sns_host("cn-north-1") == "sns.cn-north-1.amazonaws.com.cn"
    for bad, region in [
        (good, "us-east-1"),  # another region's host
        ("https://127.0.0.1:8443/SimpleNotificationService-abc.pem", "eu-west-1"),
        ("https://sns.eu-west-1.amazonaws.com:444/SimpleNotificationService-abc.pem", "eu-west-1"),
    ]:
        with pytest.raises(Refused):
            strict.check_url(bad, region, path_suffix=".pem")


async def test_a_suppression_list_bounce_and_a_complaint_list_the_mailbox(
    now: dt.datetime, signers: Signers, hooks: Hooks, sent: Any, db_conn: psycopg.Connection[Any]
) -> None:
    listed: SentMessage = sent("0102-z", recipient="listed@example.org")
    angry: SentMessage = sent("0102-w", recipient="angry@example.org")
    suppressed = SnsSigner.bounce(
        "0102-z", listed.recipient, now, subtype="OnAccountSuppressionList"
    )
    complaint = {
        "notificationType": "Complaint",
        "complaint": {
            "complainedRecipients": [{"emailAddress": angry.recipient}],
            "timestamp": now.isoformat(),
            "complaintFeedbackType": "abuse",
        },
        "mail": {"messageId": "0102-w", "source": "no-reply@mail.example.com"},
    }
    for event in (suppressed, complaint):
        assert (await hooks.post("ses", signers.sns.message(event, now))).status == 200
    rows = stored(
        db_conn,
        "SELECT recipient_key, reason, expires_at IS NULL FROM leasebox.suppressions ORDER BY 1",
    )
    assert rows == [
        ("angry@example.org", "complaint", True),
        ("listed@example.org", "provider", False),
    ]
