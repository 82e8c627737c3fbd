"""An emulated Kubernetes API for the test suite, on kmock's public API.

`emulator.KubeEmulator` serves it from a thread (kopf, the official client, kubectl and
subprocesses reach it over HTTP); `server` holds the request handling, `semantics` the pure
API rules, `apply` server-side apply, `tables` the Table format of `kubectl get`, and
`harness` runs `leasebox operator` against it.
"""
