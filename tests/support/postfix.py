"""A private Postfix (Debian's) on loopback: the real mail server the SMTP client is tested on.

Each test process runs its own instance, under a directory of its own: `config_directory`,
`queue_directory`, `data_directory`, the log and the mailbox, so that it never touches the
system's default instance in /etc/postfix and two processes (pytest-xdist) never share one.
Postfix's `master` must start as root, so a test run that is not root cannot have it.

The instance listens on three free ports of 127.0.0.1, one `smtpd` each (master.cf's `-o`
overrides): `port` offers everything (PIPELINING, 8BITMIME, SMTPUTF8, STARTTLS with a
certificate made for the run, SIZE with `message_size_limit`); `no_pipelining_port` the same
without PIPELINING; `greylisting_port` asks a greylisting policy service at RCPT
(`support.postfix_policy`), a 450 on a triple's first contact. Every port hangs up on a
client that writes past a command that must end a pipelined group, such as the message
before the 354 that answers DATA, and logs "improper command pipelining"
(`smtpd_forbid_unauth_pipelining`). Postfix cannot tell a client that pipelines MAIL and
RCPT without PIPELINING from one that waits: only the client's writes show that.

Everything accepted is delivered by Postfix's `virtual` agent into one Maildir, `inbox`;
a test finds its message there by its delivery key. The log goes to a file (`maillog_file`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from leasebox.testing.ports import free_port
from support.postfix_policy import PolicyService
from support.postfix_tls import Certificates, make_certificates

# What the instance accepts mail for: every other domain is refused (no relaying).
DOMAINS = ("example.com", "xn--bcher-kva.example")
SIZE_LIMIT = 256 * 1024
SENDER = "no-reply@example.com"
_SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
_MAILBOX_UID = 65534  # nobody: the virtual agent refuses to deliver as root


class PostfixUnavailable(Exception):
    """Postfix cannot run here; the message says why (missing, or not root)."""


def postfix_program() -> str:
    """The `postfix` command, or PostfixUnavailable saying what is missing."""
    found = shutil.which("postfix", path=f"{os.environ.get('PATH', '')}:{_SBIN}")
    if found is None:
        raise PostfixUnavailable("postfix is missing (Debian package postfix)")
    if os.geteuid() != 0:
        raise PostfixUnavailable("postfix's master must start as root; the tests are not root")
    return found


def _main_cf(directory: Path, tls: Certificates, policy_port: int) -> str:
    settings = {
        "compatibility_level": "3.6",
        "queue_directory": directory / "queue",
        "data_directory": directory / "data",
        "mail_owner": "postfix",
        "setgid_group": "postdrop",
        "myhostname": "mx.leasebox.test",
        "mydomain": "leasebox.test",
        "mydestination": "",
        "inet_interfaces": "127.0.0.1",
        "inet_protocols": "ipv4",
        "mynetworks": "127.0.0.0/8",
        "alias_maps": "",
        "alias_database": "",
        "local_recipient_maps": "",
        "relay_domains": "",
        "smtpd_relay_restrictions": "reject_unauth_destination",
        "smtpd_data_restrictions": "reject_unauth_pipelining",
        "smtpd_forbid_unauth_pipelining": "yes",
        "smtpd_error_sleep_time": "0s",
        "in_flow_delay": "0s",
        "message_size_limit": str(SIZE_LIMIT),
        "smtputf8_enable": "yes",
        "smtpd_tls_security_level": "may",
        "smtpd_tls_cert_file": tls.cert_file,
        "smtpd_tls_key_file": tls.key_file,
        "smtpd_tls_received_header": "yes",
        "smtpd_tls_loglevel": "1",
        "virtual_mailbox_domains": ", ".join(DOMAINS),
        "virtual_mailbox_base": directory / "mail",
        "virtual_mailbox_maps": "static:inbox/",
        "virtual_uid_maps": f"static:{_MAILBOX_UID}",
        "virtual_gid_maps": f"static:{_MAILBOX_UID}",
        "maillog_file": directory / "maillog",
        "maillog_file_prefixes": directory,
        "greylisting_restrictions": f"check_policy_service inet:127.0.0.1:{policy_port}",
    }
    return "".join(f"{name} = {value}\n" for name, value in settings.items())


def _master_cf(port: int, no_pipelining_port: int, greylisting_port: int) -> str:
    smtpd = "inet  n       -       n       -       -       smtpd"
    lines = [
        f"127.0.0.1:{port} {smtpd}",
        f"127.0.0.1:{no_pipelining_port} {smtpd}",
        "  -o smtpd_discard_ehlo_keywords=pipelining",
        f"127.0.0.1:{greylisting_port} {smtpd}",
        "  -o smtpd_recipient_restrictions=$greylisting_restrictions",
    ]
    services = {
        "cleanup": "unix  n - n - 0 cleanup",
        "qmgr": "unix  n - n 300 1 qmgr",
        "tlsmgr": "unix  - - n 1000? 1 tlsmgr",
        "rewrite": "unix  - - n - - trivial-rewrite",
        "bounce": "unix  - - n - 0 bounce",
        "defer": "unix  - - n - 0 bounce",
        "trace": "unix  - - n - 0 bounce",
        "verify": "unix  - - n - 1 verify",
        "proxymap": "unix  - - n - - proxymap",
        "smtp": "unix  - - n - - smtp",
        "error": "unix  - - n - - error",
        "retry": "unix  - - n - - error",
        "discard": "unix  - - n - - discard",
        "virtual": "unix  - n n - - virtual",
        "anvil": "unix  - - n - 1 anvil",
        "scache": "unix  - - n - 1 scache",
        "postlog": "unix-dgram n - n - 1 postlogd",
    }
    lines += [f"{name} {line}" for name, line in services.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Postfix:
    """A running private instance: its ports, its files and what it delivered."""

    directory: Path
    port: int
    no_pipelining_port: int
    greylisting_port: int
    certificates: Certificates
    policy: PolicyService
    version: str

    @property
    def inbox(self) -> Path:
        return self.directory / "mail" / "inbox"

    def url(self, port: int | None = None, *, sender: str = SENDER, **options: object) -> str:
        """The provider URL of one of the ports (`port` by default), with URL options."""
        query = {"from": quote(sender, safe=""), **{k: str(v) for k, v in options.items()}}
        tail = "&".join(f"{name}={value}" for name, value in query.items())
        return f"smtp://127.0.0.1:{port or self.port}?{tail}"

    def messages(self) -> list[bytes]:
        """Every delivered message, as the Maildir holds it."""
        return [path.read_bytes() for path in self._files()]

    def delivered(self, key: str) -> list[bytes]:
        """The delivered messages of delivery key `key`."""
        marker = f"\nX-Leasebox-Delivery-Key: {key}\n".encode()
        return [data for data in self.messages() if marker in data]

    def count(self, prefix: str) -> int:
        """How many delivered messages have a delivery key starting with `prefix`."""
        marker = f"\nX-Leasebox-Delivery-Key: {prefix}".encode()
        return sum(1 for path in self._files() if marker in path.read_bytes())

    def _files(self) -> list[Path]:
        return sorted(
            path
            for part in ("new", "cur")
            for path in (self.inbox / part).glob("*")
            if path.is_file()
        )

    def log(self) -> str:
        path = self.directory / "maillog"
        return path.read_text("utf-8", "replace") if path.exists() else ""

    def queue_empty(self) -> bool:
        """Whether nothing waits in the queue (every accepted message was delivered)."""
        queue = self.directory / "queue"
        return not any(
            path.is_file()
            for part in ("incoming", "active", "deferred", "hold", "maildrop")
            for path in (queue / part).rglob("*")
        )


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{_SBIN}"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _master_running(directory: Path) -> bool:
    pid_file = directory / "queue" / "pid" / "master.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _log_tail(directory: Path) -> str:
    path = directory / "maillog"
    return path.read_text("utf-8", "replace")[-1500:] if path.exists() else ""


def _until(check: Callable[[], bool], timeout: float, what: str, directory: Path) -> None:
    """Poll `check` until it holds; RuntimeError with the log's tail if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"postfix: {what} within {timeout:.0f} s; log: {_log_tail(directory)}")


@contextmanager
def running_postfix(parent: Path | None = None) -> Iterator[Postfix]:
    """Start a private instance under a new directory (in `parent`, or the system's temporary
    directory), and stop it and remove its files afterwards."""
    program = postfix_program()
    # Postfix's daemons run as `postfix` and must reach their queue: not under a 0700 dir.
    directory = Path(tempfile.mkdtemp(prefix="leasebox-postfix-", dir=parent))
    directory.chmod(0o755)
    policy = PolicyService()
    started = False
    try:
        config = directory / "etc"
        config.mkdir()
        (directory / "mail").mkdir()
        os.chown(directory / "mail", _MAILBOX_UID, _MAILBOX_UID)
        (directory / "queue").mkdir()  # root's; `postfix start` makes what is inside
        (directory / "data").mkdir()
        shutil.chown(directory / "data", "postfix")
        certificates = make_certificates(config)
        ports = (free_port(), free_port(), free_port())
        (config / "main.cf").write_text(_main_cf(directory, certificates, policy.port))
        (config / "master.cf").write_text(_master_cf(*ports))
        done = _run([program, "-c", str(config), "start"])
        started = True
        if done.returncode != 0:  # a broken instance is an error, never a skip
            raise RuntimeError(f"postfix start failed: {done.stderr} {_log_tail(directory)}")
        _until(lambda: all(map(_listening, ports)), 30, "no smtpd listening", directory)
        version = _run(["postconf", "-c", str(config), "-h", "mail_version"]).stdout.strip()
        yield Postfix(directory, *ports, certificates, policy, version)
    finally:
        try:
            if started:
                _run([program, "-c", str(directory / "etc"), "stop"])
                _until(lambda: not _master_running(directory), 30, "no stop", directory)
        finally:
            policy.stop()
            shutil.rmtree(directory, ignore_errors=True)
