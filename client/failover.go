package client

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// Several replicas (C2 #ct2-failover). A client of several addresses — a
// comma-separated target, WithAddresses, or a dns:/// target — dials them
// through a resolver of its own (failoverResolver) with gRPC's pick_first
// balancer: one connection at a time, to the first address that answers
// (pick_first tries the next one after 250 ms: Happy Eyeballs). A broken
// connection makes pick_first connect again. A replica that drains, or a
// stream that stalls, is set aside: the resolver reports the addresses
// without it, which makes pick_first drop its connection and connect to
// another. gRPC does all the connecting; the SDK only says which address
// to avoid.

// failoverScheme is the resolver scheme of a Client with several addresses;
// the resolver is registered with that Client only (grpc.WithResolvers).
const failoverScheme = "lockd-failover"

// asideFor is how long a replica that drains or stalls is avoided.
const asideFor = 30 * time.Second

// WithAddresses sets the addresses of the lockd replicas (host:port) to use
// instead of New's target, which is then only a name for errors: the
// client connects to one of them, and moves to another when its replica
// dies, drains or stalls (C2 #ct2-failover). A comma-separated target
// ("a:7420,b:7420") does the same.
func WithAddresses(addrs ...string) Option {
	return func(o *options) { o.addresses = append([]string(nil), addrs...) }
}

// splitTarget returns the addresses of a failover target: WithAddresses, a
// comma-separated list, or nil for a single target. A dns:/// target is
// returned as its own inner target with several set.
func splitTarget(target string, addrs []string) (list []string, dnsTarget string, err error) {
	if len(addrs) == 0 && strings.Contains(target, ",") {
		addrs = strings.Split(target, ",")
	}
	if len(addrs) == 0 {
		if strings.HasPrefix(target, "dns:") {
			return nil, target, nil
		}
		return nil, "", nil
	}
	for i, a := range addrs {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil || strings.Contains(a, "://") {
			return nil, "", fmt.Errorf("%w: address %q of %q: want host:port", ErrInvalidArgument, a, target)
		}
		addrs[i] = a
	}
	return addrs, "", nil
}

// failoverResolver is the resolver.Builder and resolver.Resolver of one
// Client: it reports the client's addresses (a static list, or what the
// dns resolver finds) minus the ones set aside.
type failoverResolver struct {
	static    []string // host:port list, or nil with dnsTarget
	dnsTarget string   // dns:///name:port, or ""
	now       func() time.Time

	mu     sync.Mutex
	cc     resolver.ClientConn
	inner  resolver.Resolver
	latest []resolver.Address   // every address, as last resolved
	aside  map[string]time.Time // address → avoided until
	peers  map[string]string    // remote address of a dialed conn → resolver address
	pushed map[string]bool      // the addresses last reported
	closed bool
}

func newFailoverResolver(static []string, dnsTarget string, now func() time.Time) *failoverResolver {
	return &failoverResolver{static: static, dnsTarget: dnsTarget, now: now,
		aside: map[string]time.Time{}, peers: map[string]string{}}
}

// Scheme implements resolver.Builder.
func (r *failoverResolver) Scheme() string { return failoverScheme }

// Build implements resolver.Builder: the Client's one channel builds it
// once.
func (r *failoverResolver) Build(_ resolver.Target, cc resolver.ClientConn, opts resolver.BuildOptions) (resolver.Resolver, error) {
	r.mu.Lock()
	r.cc = cc
	r.mu.Unlock()
	if r.dnsTarget == "" {
		addrs := make([]resolver.Address, 0, len(r.static))
		for _, a := range r.static {
			host, _, _ := net.SplitHostPort(a)
			addrs = append(addrs, resolver.Address{Addr: a, ServerName: host})
		}
		r.update(addrs)
		return r, nil
	}
	u, err := parseTarget(r.dnsTarget)
	if err != nil {
		return nil, err
	}
	b := resolver.Get("dns")
	if b == nil {
		return nil, fmt.Errorf("client: no dns resolver")
	}
	host, _, err := net.SplitHostPort(u.Endpoint())
	if err != nil {
		host = u.Endpoint()
	}
	inner, err := b.Build(u, &dnsClientConn{ClientConn: cc, r: r, host: host}, opts)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.inner = inner
	r.mu.Unlock()
	return r, nil
}

// parseTarget parses a gRPC target string as grpc does (a URL).
func parseTarget(t string) (resolver.Target, error) {
	u, err := url.Parse(t)
	if err != nil {
		return resolver.Target{}, fmt.Errorf("%w: target %q: %v", ErrInvalidArgument, t, err)
	}
	return resolver.Target{URL: *u}, nil
}

// dnsClientConn passes the dns resolver's answers through the failover
// resolver, which filters them.
type dnsClientConn struct {
	resolver.ClientConn
	r    *failoverResolver
	host string
}

func (d *dnsClientConn) UpdateState(s resolver.State) error {
	addrs := make([]resolver.Address, 0, len(s.Addresses))
	for _, a := range s.Addresses {
		if a.ServerName == "" {
			a.ServerName = d.host // TLS checks the name the user dialed
		}
		addrs = append(addrs, a)
	}
	for _, e := range s.Endpoints {
		for _, a := range e.Addresses {
			if a.ServerName == "" {
				a.ServerName = d.host
			}
			addrs = append(addrs, a)
		}
	}
	d.r.update(dedupe(addrs))
	return nil
}

func dedupe(addrs []resolver.Address) []resolver.Address {
	seen := map[string]bool{}
	out := addrs[:0]
	for _, a := range addrs {
		if !seen[a.Addr] {
			seen[a.Addr] = true
			out = append(out, a)
		}
	}
	return out
}

// ResolveNow implements resolver.Resolver.
func (r *failoverResolver) ResolveNow(o resolver.ResolveNowOptions) {
	r.mu.Lock()
	inner := r.inner
	r.mu.Unlock()
	if inner != nil {
		inner.ResolveNow(o)
	}
	r.refresh()
}

// Close implements resolver.Resolver.
func (r *failoverResolver) Close() {
	r.mu.Lock()
	inner := r.inner
	r.closed = true
	r.mu.Unlock()
	if inner != nil {
		inner.Close()
	}
}

// update records a new resolution and reports it.
func (r *failoverResolver) update(addrs []resolver.Address) {
	r.mu.Lock()
	r.latest = addrs
	r.mu.Unlock()
	r.refresh()
}

// refresh reports the addresses not set aside (every address when that
// would leave none), forgetting asides that expired. It reports only a
// change.
func (r *failoverResolver) refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cc == nil || r.closed || len(r.latest) == 0 {
		return
	}
	now := r.now()
	var keep []resolver.Address
	for _, a := range r.latest {
		if until, ok := r.aside[a.Addr]; ok && now.Before(until) {
			continue
		}
		delete(r.aside, a.Addr)
		keep = append(keep, a)
	}
	if len(keep) == 0 {
		clear(r.aside)
		keep = r.latest
	}
	set := make(map[string]bool, len(keep))
	for _, a := range keep {
		set[a.Addr] = true
	}
	if mapsEqual(set, r.pushed) {
		return
	}
	r.pushed = set
	_ = r.cc.UpdateState(resolver.State{Addresses: append([]resolver.Address(nil), keep...)})
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// setAside avoids the replica at remote (a connection's remote address)
// for asideFor; draining says it shuts down (a draining reply or a
// SHUTTING_DOWN refusal), else it stalled. When every other address is set
// aside already, a draining replica is left all the same and the others'
// asides are forgotten (the last replica of a rolling restart drains; the
// others drained a moment ago and are likely back; C2 #ct2-failover); a
// stalled one is kept (every replica slow must not make the client hop).
// It reports whether the addresses changed: false means there is nowhere
// else to go.
func (r *failoverResolver) setAside(remote net.Addr, draining bool) bool {
	if remote == nil {
		return false
	}
	r.mu.Lock()
	addr, ok := r.peers[remote.String()]
	if !ok {
		addr = remote.String()
	}
	known := false
	var others []string // every other address, aside or not
	for _, a := range r.latest {
		if a.Addr == addr {
			known = true
			continue
		}
		others = append(others, a.Addr)
	}
	if !known || len(others) == 0 {
		r.mu.Unlock()
		return false
	}
	now := r.now()
	if !slices.ContainsFunc(others, func(a string) bool {
		until, ok := r.aside[a]
		return !ok || !now.Before(until)
	}) {
		if !draining {
			r.mu.Unlock()
			return false
		}
		for _, a := range others {
			delete(r.aside, a)
		}
	}
	r.aside[addr] = now.Add(asideFor)
	r.mu.Unlock()
	r.refresh()
	return true
}

// clearAside forgets every aside: the addresses left all failed.
func (r *failoverResolver) clearAside() {
	r.mu.Lock()
	n := len(r.aside)
	clear(r.aside)
	r.mu.Unlock()
	if n > 0 {
		r.refresh()
	}
}

// maxPeers bounds the remote → resolver address map.
const maxPeers = 256

// dial is the channel's dialer: it dials a resolver address and remembers
// which remote address the connection reached, so that a stream's peer can
// be traced back to the address to set aside.
func (r *failoverResolver) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if len(r.peers) >= maxPeers {
		clear(r.peers)
	}
	r.peers[conn.RemoteAddr().String()] = addr
	r.mu.Unlock()
	return conn, nil
}

// dialOptions are the channel options of a failover client.
func (r *failoverResolver) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithContextDialer(r.dial),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"pick_first": {}}]}`),
	}
}

// asideOnShutdown is a unary interceptor: a call refused because the
// replica is shutting down (SHUTTING_DOWN) sets that replica aside, so the
// retry goes elsewhere.
func (r *failoverResolver) asideOnShutdown(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if err != nil && isShuttingDown(err) {
		r.setAside(p.Addr, true)
	}
	return err
}

// isShuttingDown reports whether a call's error is the SHUTTING_DOWN
// refusal of a replica that drains.
func isShuttingDown(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	return wireerr.Reason(st) == wireerr.ReasonShuttingDown
}
