package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// HTTP/2 flow-control windows of the client's connection. Replies are
// small; static windows this large never stall them.
const (
	streamWindow = 1 << 20
	connWindow   = 16 << 20
)

// minConnectTimeout is how long one connection attempt may take at least
// (gRPC's default; set with the connection backoff, which would otherwise
// make it 0 and cut a slow TLS handshake at the backoff's first step).
const minConnectTimeout = 20 * time.Second

// Client is a connection to a lockd server. It is safe for concurrent use.
// All sessions of a Client share one KeepAlive stream.
type Client struct {
	conn  *grpc.ClientConn
	api   lockdv1.LockServiceClient
	opts  options
	clock Clock
	log   *slog.Logger

	// ctx ends when Close begins; every goroutine of the client watches it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ka *keepaliver
	// failover is the resolver of a client of several addresses (nil for
	// one address): it sets a draining or stalled replica aside.
	failover *failoverResolver

	closeOnce sync.Once
}

// New creates a client of the lockd server at target: host:port or any gRPC
// target, or several replicas of one backend — "a:7420,b:7420,c:7420"
// (also WithAddresses) or a DNS name, "dns:///lockd.example:7420". With
// several addresses the client uses one replica at a time and moves its
// KeepAlive stream and pending calls to another when that replica dies,
// drains or stalls, keeping its sessions, locks and queue places (C2
// #ct2-failover). It does not wait for the connection: calls retry until
// their context ends while the server is unreachable. Plaintext is the default
// only for a loopback target; any other target needs WithTLS,
// WithTLSFiles or WithTransportCredentials, or WithInsecure to send
// plaintext anyway (tls.go).
func New(target string, opts ...Option) (*Client, error) {
	o := options{clock: realClock{}, backoffMin: DefaultBackoffMin, backoffMax: DefaultBackoffMax}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case o.clock == nil:
		return nil, fmt.Errorf("%w: nil clock", ErrInvalidArgument)
	case o.backoffMin <= 0 || o.backoffMax < o.backoffMin:
		return nil, fmt.Errorf("%w: backoff bounds must satisfy 0 < min <= max", ErrInvalidArgument)
	}
	if err := checkTiming(o.ttl, o.safetyMargin, o.heartbeatInterval); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	// Several addresses or a DNS name: a resolver of this client's own
	// (failover.go). The transport rules hold for every address: plaintext
	// and a bearer token over it only if all of them are on loopback.
	addrs, dnsTarget, err := splitTarget(target, o.addresses)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	secTarget, dialTarget := target, target
	var fo *failoverResolver
	if len(addrs) > 0 || dnsTarget != "" {
		fo = newFailoverResolver(addrs, dnsTarget, o.clock.Now)
		dialTarget = failoverScheme + ":///lockd"
		if len(addrs) > 0 {
			secTarget = addrs[0]
			for _, a := range addrs {
				if !loopbackTarget(a) {
					secTarget = a
					break
				}
			}
		}
	}
	creds, err := o.transport.credentials(secTarget)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Static flow-control windows: no bandwidth-delay PING after each
		// reply (see the server's transport settings).
		grpc.WithStaticStreamWindowSize(streamWindow),
		grpc.WithStaticConnWindowSize(connWindow),
		// The transport reconnects within the backoff's bounds too, not
		// after gRPC's default (1 s growing to 120 s): a server back
		// from a long outage is reached within about backoffMax of its
		// return (C2 #ct2-sdk rule 11).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: o.backoffMin, Multiplier: 2, Jitter: 0.2, MaxDelay: o.backoffMax,
		}, MinConnectTimeout: minConnectTimeout}),
	}
	if o.tracer != nil { // outermost: the span covers the whole call (trace.go)
		dial = append(dial, grpc.WithChainUnaryInterceptor(tracingInterceptor(o.tracer)))
	}
	if fo != nil {
		dial = append(dial, fo.dialOptions()...)
		dial = append(dial, grpc.WithChainUnaryInterceptor(fo.asideOnShutdown))
	}
	dial = append(dial, o.dial...)
	bearer, err := o.token.dialOption(secTarget, creds) // token.go
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if bearer != nil {
		dial = append(dial, bearer)
	}
	conn, err := grpc.NewClient(dialTarget, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %q: %w", target, err)
	}
	c := &Client{
		conn:     conn,
		api:      lockdv1.NewLockServiceClient(conn),
		opts:     o,
		clock:    o.clock,
		log:      orDiscard(o.logger),
		failover: fo,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.ka = newKeepaliver(c)
	c.wg.Add(1)
	go c.ka.run() // exits when c.ctx ends (Close)
	return c, nil
}

// Close ends every session of the client (their Done channels close and
// their locks are released on the server, best effort within
// DefaultCloseTimeout), stops the client's goroutines and closes the
// connection.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		sessions := c.ka.all()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
		var wg sync.WaitGroup
		for _, s := range sessions {
			wg.Add(1)
			go func() { // exits when the close RPC returns (bounded by ctx)
				defer wg.Done()
				_ = s.Close(ctx)
			}()
		}
		wg.Wait()
		cancel()
		c.cancel()
		c.wg.Wait()
		err = c.conn.Close()
	})
	return err
}

// backoff returns the wait before retry number attempt (0-based), with
// jitter.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.opts.backoffMin << min(attempt, 16)
	if d > c.opts.backoffMax || d <= 0 {
		d = c.opts.backoffMax
	}
	return d/2 + rand.N(d/2+1)
}

// sleep waits d on the client's clock; it reports false when ctx or the
// client ended first.
func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	ch := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(ch) })
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	case <-c.ctx.Done():
		return false
	}
}

// retry calls f until it succeeds, fails with a non-retryable error, or ctx
// ends (then the error matches both ctx.Err() and the last retryable
// error). f returns errors already mapped by fromStatus.
//
// A ctx that ends while an attempt is in flight still reports the last
// retryable answer: the caller learns why nothing succeeded (for example
// ErrUnavailable), not only that it stopped waiting.
func (c *Client) retry(ctx context.Context, f func(ctx context.Context) error) error {
	var last error // the last retryable error answered
	for attempt := 0; ; attempt++ {
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		err := f(ctx)
		switch {
		case err == nil:
			return nil
		case retryable(err):
			last = err
		case ctx.Err() == nil || !isContextErr(err):
			return err // a final answer
		}
		if ctx.Err() != nil {
			if last == nil {
				return err
			}
			return fmt.Errorf("%w: %w", ctx.Err(), last)
		}
		c.log.LogAttrs(ctx, slog.LevelDebug, "retrying", slog.String("error", err.Error()))
		if !c.sleep(ctx, c.backoff(attempt)) {
			if ctx.Err() != nil {
				return fmt.Errorf("%w: %w", ctx.Err(), last)
			}
			return ErrClosed
		}
	}
}

// isContextErr reports whether err is a context's cancellation or deadline.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// LockInfo describes a key.
type LockInfo struct {
	// Key is the key described.
	Key string
	// Held is false when nobody holds the key; the other fields are then
	// empty.
	Held bool
	// Session is the holder's session id, Token the grant's fencing token.
	Session string
	Token   uint64
	// AcquiredAt is the grant time on the backend's clock (display only).
	AcquiredAt time.Time
	// Waiters are the sessions queued for the key, first in line first.
	Waiters []string
	// Owner and Labels are the holder session's (WithOwner); Value is the
	// grant's (WithValue). Empty when not set.
	Owner  string
	Labels map[string]string
	Value  []byte
	// Holders lists every holder of a semaphore or read/write key, lowest
	// token first; the single-holder fields above then describe the first.
	// Empty for a plain lock.
	Holders []HolderInfo
	// Limit is the semaphore's N (1 for a read/write lock); 0 for a plain
	// lock.
	Limit uint32
	// LockDelay is the held grant's lock-delay (WithLockDelay).
	LockDelay time.Duration
	// DelayRemaining is set when nobody holds the key but a lock-delay
	// still keeps it from being granted: about how long it does.
	DelayRemaining time.Duration
	// WaitEstimates (Inspect only) estimate each waiter's wait, in queue
	// order; empty when the server knows none. Never a promise (C2
	// #ct2-wait-estimate).
	WaitEstimates []WaitEstimate
}

// WaitEstimate is one waiter's estimated wait: Position 1 is next in line,
// Wait about how long from Inspect's answer until its grant.
type WaitEstimate struct {
	Session  string
	Position int
	Wait     time.Duration
}

// HolderInfo is one holder of a semaphore or read/write key.
type HolderInfo struct {
	// Session is the holder's session id, Token its own grant's fencing
	// token.
	Session string
	Token   uint64
	// AcquiredAt is the grant time on the backend's clock (display only).
	AcquiredAt time.Time
	// Mode is "shared" or "exclusive" for a read/write lock, "" for a
	// semaphore slot.
	Mode string
	// Owner and Labels are the holder session's (WithOwner); Value is the
	// grant's (WithValue, Lock.SetValue). Empty when not set.
	Owner  string
	Labels map[string]string
	Value  []byte
}

// Holder describes the holder for people: its owner (quoted if it is not
// plain printable text), else its session, and the grant's token.
func (i LockInfo) Holder() string {
	who := "session " + i.Session
	if i.Owner != "" {
		who = i.Owner
		if wirelimits.ValidateOwner(i.Owner) != nil || strings.ContainsAny(i.Owner, "\"") {
			who = strconv.Quote(i.Owner)
		}
	}
	return fmt.Sprintf("%s token %d", who, i.Token)
}

func lockInfo(p *lockdv1.LockInfo) LockInfo {
	info := LockInfo{Key: p.GetKey(), Held: true, Session: p.GetSessionId(), Token: p.GetToken(),
		Waiters: p.GetWaiters(), Owner: p.GetOwner(), Labels: p.GetLabels(), Value: p.GetValue(),
		LockDelay: ms(p.GetLockDelayMs())}
	if p.GetAcquiredAt() != nil {
		info.AcquiredAt = p.GetAcquiredAt().AsTime()
	}
	info.Limit = p.GetLimit()
	for _, h := range p.GetHolders() {
		hi := HolderInfo{Session: h.GetSessionId(), Token: h.GetToken(), Owner: h.GetOwner(), Labels: h.GetLabels(), Value: h.GetValue()}
		switch h.GetMode() {
		case lockdv1.LockMode_LOCK_MODE_SHARED:
			hi.Mode = "shared"
		case lockdv1.LockMode_LOCK_MODE_EXCLUSIVE:
			hi.Mode = "exclusive"
		}
		if h.GetAcquiredAt() != nil {
			hi.AcquiredAt = h.GetAcquiredAt().AsTime()
		}
		info.Holders = append(info.Holders, hi)
	}
	for _, w := range p.GetWaitEstimates() {
		info.WaitEstimates = append(info.WaitEstimates, WaitEstimate{w.GetSessionId(), int(w.GetPosition()), ms(w.GetEstimateMs())})
	}
	return info
}

// Inspect describes key: its holder, token and waiters.
func (c *Client) Inspect(ctx context.Context, key string) (LockInfo, error) {
	if err := validateKey(key); err != nil {
		return LockInfo{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	var resp *lockdv1.InspectResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.Inspect(ctx, &lockdv1.InspectRequest{Key: key})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return LockInfo{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	if !resp.GetHeld() {
		return LockInfo{Key: key, DelayRemaining: ms(resp.GetLock().GetDelayRemainingMs())}, nil
	}
	return lockInfo(resp.GetLock()), nil
}

// List returns one page of the held keys that start with prefix, in key
// order, and the token of the next page ("" after the last page).
func (c *Client) List(ctx context.Context, prefix string, opts ListOptions) ([]LockInfo, string, error) {
	var resp *lockdv1.ListResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.List(ctx, &lockdv1.ListRequest{Prefix: prefix, PageToken: opts.PageToken,
			Limit: int32(min(max(opts.Limit, -1), wirelimits.MaxListLimit+1))})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return nil, "", fmt.Errorf("list %q: %w", prefix, err)
	}
	infos := make([]LockInfo, 0, len(resp.GetLocks()))
	for _, l := range resp.GetLocks() {
		infos = append(infos, lockInfo(l))
	}
	return infos, resp.GetNextPageToken(), nil
}

// Revoke deletes key's grant whoever holds it and returns the revoked grant
// (Held false when the key was free). It breaks the holder's trust: the
// holder is told and its Lock.Done closes; the fencing token protects the
// resource meanwhile.
func (c *Client) Revoke(ctx context.Context, key string) (LockInfo, error) {
	if err := validateKey(key); err != nil {
		return LockInfo{}, fmt.Errorf("revoke %q: %w", key, err)
	}
	var resp *lockdv1.RevokeResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.Revoke(ctx, &lockdv1.RevokeRequest{Key: key})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return LockInfo{}, fmt.Errorf("revoke %q: %w", key, err)
	}
	if !resp.GetRevoked() {
		return LockInfo{Key: key}, nil
	}
	return LockInfo{Key: key, Held: true, Session: resp.GetSessionId(), Token: resp.GetToken()}, nil
}

// EventKind says what happened to a key.
type EventKind int

// Event kinds.
const (
	// EventAcquired: a session was granted the key.
	EventAcquired EventKind = iota + 1
	// EventReleased: the holder released the key.
	EventReleased
	// EventExpired: the holder's session ended and took the grant with it.
	EventExpired
	// EventRevoked: an administrator revoked the grant.
	EventRevoked
	// EventValue: the holder set the grant's value (WithValue, Lock.SetValue,
	// Leadership.Proclaim); the grant and its token are unchanged. Only
	// watches made WithHolders report it.
	EventValue
	// EventMaxHold: the server revoked the grant because it was held
	// longer than its WithMaxHold.
	EventMaxHold
	// EventResync: the watch broke and was re-opened (another replica, a
	// restart) from a position whose events the backend no longer knows
	// (PostgreSQL keeps no event history; etcd's was compacted): events may
	// have been missed, so re-read the state you follow (Inspect, List).
	// Only Kind is set. C2 #ct2-watch-resume.
	EventResync
)

// String returns the kind's name as the CLI prints it: acquired, released,
// expired, revoked, value, max_hold.
func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventReleased:
		return "released"
	case EventExpired:
		return "expired"
	case EventRevoked:
		return "revoked"
	case EventValue:
		return "value"
	case EventMaxHold:
		return "max_hold"
	case EventResync:
		return "resync"
	}
	return "unknown"
}

// Event is one change to a key, as Watch reports it.
type Event struct {
	// Kind says what happened; Key is the key it happened to.
	Kind EventKind
	Key  string
	// Session and Token are the grant's: the new holder's in an acquired
	// event, the ended grant's in a released, expired, revoked or max_hold
	// event.
	Session string
	Token   uint64
	// Owner and Labels are the holder session's, Value the grant's value:
	// set only in acquired and value events of a watch made WithHolders,
	// read when the server sent the event (not when it happened), and only
	// if the grant was still current then.
	Owner  string
	Labels map[string]string
	Value  []byte
	// Err is set only on the last event before the channel closes because
	// the watch broke (not because its context ended); events may have been
	// missed.
	Err error
}

// WatchOption configures a Watch.
type WatchOption func(*watchOptions)

type watchOptions struct{ holders bool }

// WithHolders asks the server for the holder's owner, labels and value in
// acquired events, and for value events (EventValue) when a holder sets its
// grant's value. The server reads them for each such event (one read per
// event), so a watch of a busy prefix costs more with it.
func WithHolders() WatchOption { return func(o *watchOptions) { o.holders = true } }

// validateKey is wirelimits.ValidateKey with the SDK's sentinel.
func validateKey(key string) error { return invalidInput("key", wirelimits.ValidateKey(key)) }
