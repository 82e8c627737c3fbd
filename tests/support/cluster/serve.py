"""`make cluster`: the test control plane and its process node, started by hand.

The same programs, certificates and node the cluster tests use, kept running until
Ctrl-C, so that a person can point kubectl, Helm or the operator at them and look. With
`--chart` the chart is installed as the tests install it (its operator a pod of the node).
The files (kubeconfig, logs, the node's pods) live in `build/cluster-manual/`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from support.cluster.controlplane import ROOT, ControlPlaneUnavailable, start_control_plane
from support.cluster.kubelet import ProcessKubelet, cleanup
from support.cluster.release import CHART, helm_client, operator_values

FOLDER = ROOT / "build" / "cluster-manual"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--chart", action="store_true", help="also helm install charts/leasebox")
    args = parser.parse_args(argv)
    cleanup(FOLDER)
    try:
        plane = start_control_plane(FOLDER)
    except ControlPlaneUnavailable as exc:
        print(exc, file=sys.stderr)
        return 3
    node = ProcessKubelet(plane, FOLDER / "node").start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        if args.chart:
            with helm_client(plane, "leasebox-system") as helm:
                helm.install(
                    str(CHART), "leasebox", operator_values(), create_namespace=True, timeout=120
                )
        print(f"API server: {plane.url}")
        print(f"export KUBECONFIG={plane.admin_kubeconfig}")
        print(f"kubectl: {plane.programs / 'kubectl'}; logs in {FOLDER}; Ctrl-C stops it")
        sys.stdout.flush()
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        node.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
