"""`leasebox keys generate`: a new key for `LEASEBOX_PAYLOAD_KEYS`, and how to rotate keys.

Secrets (OTP codes, link tokens) are sealed with the first key of `LEASEBOX_PAYLOAD_KEYS`
and opened with any of them, so a key is never replaced in one step: every process must be
able to open what any other seals at every moment of a rotation.
"""

from __future__ import annotations

import argparse
from typing import Any

ROTATION = """\
rotating keys (comma-separated, first encrypts, all decrypt):
  1. add the new key at the END everywhere (workers and producers): OLD,NEW
     every process can now open what the new key seals
  2. move it to the FRONT everywhere: NEW,OLD; new secrets are sealed with it
  3. when no row sealed with OLD is left (older than your longest OTP lifetime plus
     retries, or after `leasebox prune`), remove OLD: NEW
"""


def register(subparsers: Any) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="generate payload encryption keys",
        description="Keys for LEASEBOX_PAYLOAD_KEYS, which encrypt message secrets at rest.",
        epilog=ROTATION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate",
        help="print a new key",
        description="Print a new random key for LEASEBOX_PAYLOAD_KEYS on stdout.",
        epilog=ROTATION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from leasebox.producer.payload_crypto import generate_key

    print(generate_key())
    return 0
