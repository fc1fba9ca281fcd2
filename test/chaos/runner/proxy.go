package runner

import (
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// proxy is an in-process TCP proxy between lockd and its backend, built on
// toxiproxy v2.12.0 used as a library (github.com/Shopify/toxiproxy/v2,
// without its HTTP API). partition cuts the link: a "timeout" toxic with
// timeout 0 in both directions keeps every connection open and drops every
// byte, new connections included, as a network partition does. heal closes
// every connection and starts a fresh proxy on the same address, so both
// sides see a reset after the partition and reconnect.
//
// heal does not remove the toxics: in v2.12.0, removing a timeout toxic
// from a link with data in flight leaves the link's reader and its first
// (noop) stage blocked on a channel nobody reads any more, two goroutines
// leaked per connection. Stopping the proxy with the toxics in place lets
// every link drain and end; the stopped proxy is then dropped.
type proxy struct {
	srv      *toxiproxy.ApiServer
	name     string
	upstream string

	mu     sync.Mutex
	p      *toxiproxy.Proxy
	listen string // fixed after the first start
	cut    bool
}

// Toxic names of a cut.
var cutToxics = []string{"partition_up", "partition_down"}

// newProxy starts a proxy to upstream (host:port) on a kernel-chosen
// loopback port.
func newProxy(name, upstream string) (*proxy, error) {
	px := &proxy{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), name: name,
		upstream: upstream, listen: "127.0.0.1:0"}
	if err := px.startLocked(); err != nil {
		return nil, err
	}
	return px, nil
}

// startLocked starts a fresh toxiproxy proxy on px.listen (px.mu held, or
// px not shared yet), retrying briefly while the port is being released.
func (px *proxy) startLocked() error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		p := toxiproxy.NewProxy(px.srv, px.name, px.listen, px.upstream)
		if err = p.Start(); err == nil {
			px.p, px.listen = p, p.Listen
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("proxy %s: start on %s: %w", px.name, px.listen, err)
}

// addr is the address to dial instead of the upstream's.
func (px *proxy) addr() string {
	px.mu.Lock()
	defer px.mu.Unlock()
	return px.listen
}

// partition starts dropping everything in both directions.
func (px *proxy) partition() error {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.cut {
		return nil
	}
	for i, stream := range []string{"upstream", "downstream"} {
		js := fmt.Sprintf(`{"name":%q,"type":"timeout","stream":%q,"toxicity":1,"attributes":{"timeout":0}}`,
			cutToxics[i], stream)
		if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("proxy %s: cut: %w", px.name, err)
		}
	}
	px.cut = true
	return nil
}

// heal ends a partition: it closes every connection and listens afresh.
func (px *proxy) heal() error {
	px.mu.Lock()
	defer px.mu.Unlock()
	if !px.cut {
		return nil
	}
	px.p.Stop()
	px.cut = false
	return px.startLocked()
}

// close stops the proxy and closes its connections.
func (px *proxy) close() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.p.Stop()
}
