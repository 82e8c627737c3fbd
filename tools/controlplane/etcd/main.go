// Command etcd is the etcd server of the test control plane.
//
// The etcd server module has no main package of its own; this one starts the server's
// own entry point with the command line it was given.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
