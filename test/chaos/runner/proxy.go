package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// proxy is an in-process TCP proxy between lockd and its backend, built on
// toxiproxy v2.12.0 used as a library (github.com/Shopify/toxiproxy/v2,
// without its HTTP API). cut partitions the link: a "timeout" toxic with
// timeout 0 in both directions keeps every connection open and drops every
// byte, new connections included, as a network partition does; heal removes
// the toxics, which closes the connections they held (toxiproxy's timeout
// toxic closes its link on removal), so both sides see a reset after the
// partition and reconnect.
type proxy struct {
	p *toxiproxy.Proxy

	mu  sync.Mutex
	cut bool
}

// Toxic names of a cut.
var cutToxics = []string{"partition_up", "partition_down"}

// newProxy starts a proxy to upstream (host:port) on a kernel-chosen
// loopback port.
func newProxy(name, upstream string) (*proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: start: %w", name, err)
	}
	return &proxy{p: p}, nil
}

// addr is the address to dial instead of the upstream's.
func (p *proxy) addr() string { return p.p.Listen }

// partition starts dropping everything in both directions.
func (p *proxy) partition() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return nil
	}
	for i, stream := range []string{"upstream", "downstream"} {
		js := fmt.Sprintf(`{"name":%q,"type":"timeout","stream":%q,"toxicity":1,"attributes":{"timeout":0}}`,
			cutToxics[i], stream)
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("proxy %s: cut: %w", p.p.Name, err)
		}
	}
	p.cut = true
	return nil
}

// heal ends a partition.
func (p *proxy) heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return nil
	}
	var errs []error
	for _, name := range cutToxics {
		if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			errs = append(errs, fmt.Errorf("proxy %s: heal: %w", p.p.Name, err))
		}
	}
	p.cut = false
	return errors.Join(errs...)
}

// close stops the proxy and closes its connections.
func (p *proxy) close() {
	_ = p.heal()
	p.p.Stop()
}
