"""`leasebox simulate`: the scaling policy against KEDA-style baselines on one trace.

The simulation owns its options; this module only hands it the arguments, so that
`leasebox simulate --help` shows the simulation's own help.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="compare the scaling policy with KEDA/HPA-style baselines on built-in scenarios",
        description="Run `leasebox simulate --help` for the simulation's options.",
        add_help=False,
    )
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    from leasebox.scaling.simulation.runner import main

    return main(list(args.arguments))
