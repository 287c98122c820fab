// Command etcd builds the etcd server used as an envtest control-plane
// binary. It is the same entry point as upstream's etcd main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
