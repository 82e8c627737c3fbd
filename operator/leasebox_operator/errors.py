"""The operator's problems with a pool, as one family of exceptions.

Each carries a CamelCase `reason` (a condition and Event reason) and a `message` for
people that names fields, objects and fixes, never a value read from a Secret. The
handlers turn any of them into `Ready=False` and one Event; none crashes the operator.
"""

from __future__ import annotations


class PoolProblem(Exception):
    """A reason and a safe message about one pool."""

    reason = "Problem"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason


class InvalidSpec(PoolProblem):
    """The spec does not validate; `message` names fields and problems, never values."""

    reason = "InvalidSpec"


class SecretError(PoolProblem):
    """A referenced Secret or key is missing or unusable."""

    reason = "SecretNotFound"


class ChildConflict(PoolProblem):
    """A child's name is taken by an object this pool does not own."""

    reason = "ChildConflict"


class FieldConflict(PoolProblem):
    """Another field manager *applies* fields of a child that the operator applies too.

    `fields` pairs each contested field with the manager that holds it.
    """

    reason = "FieldConflict"

    def __init__(self, message: str, fields: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


class PollError(PoolProblem):
    """The backlog could not be read (reason: ConnectionFailed, QueryTimeout, ...)."""

    reason = "PollFailed"
