// Command coredns is cluster DNS for the test environment's real nodes: CoreDNS's own server (coremain) with only
// the plugins a Kubernetes cluster's DNS uses, and `hosts` for the nodes' names (which a kind node's get from
// Docker's DNS). Nothing here forwards upstream: a name outside the cluster's zones
// is refused, so no query leaves the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Each plugin registers itself when imported.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	// The order in which a query passes the plugins: CoreDNS's own order (its plugin.cfg), kept to those above.
	dnsserver.Directives = []string{
		"reload", "bind", "ready", "health", "errors", "loadbalance", "cache", "hosts", "kubernetes", "loop",
	}
	coremain.Run()
}
