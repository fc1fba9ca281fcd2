package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"lock.dev/lockd/client"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// failoverReplicas is how many `lockd serve` children the failover
// scenario runs over the bench's backend.
const failoverReplicas = 3

// failoverKey is the lock the failover scenario's holder keeps.
const failoverKey = "failover/k"

// MetricFailoverMs is the failover scenario's figure: time from the SIGKILL
// of the replica a holder talks to until the holder's next heartbeat
// answered live through another replica.
const (
	MetricFailoverP50 = "p50 ms to next heartbeat"
	MetricFailoverP99 = "p99 ms to next heartbeat"
)

// failover measures, Config.FailoverKills times, the time from the SIGKILL
// of the replica a holder talks to until its next heartbeat answered live
// through another replica (issue 13). Three `lockd serve` children share
// the bench's backend (an embedded etcd's clients reach it over loopback
// too); one SDK client is given all three addresses, opens a session of the
// default TTL and holds one lock throughout. Before each kill a call's peer
// names the replica the client talks to; a stream interceptor notes the
// receipt and replica of every live heartbeat answer. (Not the session's
// deadline: the adopting replica's first Remaining on etcd is what the
// lease has left, which may not move the deadline.) The killed
// replica is started again on its address before the next kill, after a
// random pause within a heartbeat interval (kills land anywhere in the
// heartbeat cycle).
func (r *runner) failover(ctx context.Context) ([]Row, error) {
	cfg, b := r.cfg, r.bed
	args := []string{"serve", "--metrics-listen", "off"}
	note := fmt.Sprintf("failover: %d `lockd serve` children over ", failoverReplicas)
	switch b.backend {
	case BackendEtcd:
		args = append(args, "--backend", BackendEtcd, "--etcd-endpoints", strings.Join(b.endpoints, ","),
			"--etcd-prefix", etcdFailoverPrefix+b.run+"/")
		note += "the bench's etcd (" + cfg.Backend + ")"
	case BackendPG:
		args = append(args, "--backend", BackendPG, "--pg-schema", pgFailoverSchema)
		note += "the bench's PostgreSQL"
	}
	note += fmt.Sprintf(", default session TTL %v; one holder given every address; time from the SIGKILL of its replica "+
		"until a heartbeat answered live through another; target: under TTL/3", sessionTTL)
	kids := make([]*child, failoverReplicas)
	defer func() {
		for _, k := range kids {
			if k != nil {
				k.stop()
			}
		}
	}()
	if b.backend == BackendEtcd {
		// lockd refuses to start while etcd refuses writes (its epoch is
		// written at open): let etcd apply what the last scenario left.
		if err := b.etcdWritable(ctx, etcdFailoverPrefix+b.run+"/ready"); err != nil {
			return nil, fmt.Errorf("failover: %w", err)
		}
	}
	for i := range kids {
		k, err := startChild(ctx, cfg.LockdCommand, append(slices.Clone(args), "--listen", "127.0.0.1:0"), servingLine, r.bed.childEnv()...)
		if err != nil {
			return nil, fmt.Errorf("failover: %w", err)
		}
		kids[i] = k
	}
	addrs := make([]string, len(kids))
	for i, k := range kids {
		addrs[i] = k.addr
	}
	var lastPeer atomic.Value // string: the replica of the latest unary call
	hb := &heartbeats{}
	c, err := failoverClient(addrs, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var p peer.Peer
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
		if err == nil && p.Addr != nil {
			lastPeer.Store(p.Addr.String())
		}
		return err
	}), grpc.WithChainStreamInterceptor(hb.intercept))
	if err != nil {
		return nil, fmt.Errorf("failover: client: %w", err)
	}
	defer func() { _ = c.Close() }()
	s, err := c.NewSession(ctx)
	if err != nil {
		return nil, fmt.Errorf("failover: session: %w", err)
	}
	l, err := s.Acquire(ctx, failoverKey)
	if err != nil {
		return nil, fmt.Errorf("failover: acquire: %w", err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x666f))
	var took []time.Duration
	for n := range cfg.FailoverKills {
		if _, err := c.Inspect(ctx, failoverKey); err != nil { // names the replica in lastPeer
			return nil, fmt.Errorf("failover: inspect: %w", err)
		}
		at, _ := lastPeer.Load().(string)
		i := slices.Index(addrs, at)
		if i < 0 {
			return nil, fmt.Errorf("failover: the client talks to %q, not one of %v", at, addrs)
		}
		d, err := killAndWait(ctx, kids[i], s, hb)
		if err != nil {
			return nil, fmt.Errorf("failover: kill %d: %w", n+1, err)
		}
		took = append(took, d)
		r.progressf("failover: kill %d of %d (replica %s): next heartbeat answered after %v", n+1, cfg.FailoverKills, at,
			d.Round(time.Millisecond))
		if kids[i], err = startChild(ctx, cfg.LockdCommand, append(slices.Clone(args), "--listen", at), servingLine, r.bed.childEnv()...); err != nil {
			return nil, fmt.Errorf("failover: restart %s: %w", at, err)
		}
		// A random phase of the heartbeat cycle for the next kill.
		if err := sleep(ctx, time.Duration(rng.Int64N(int64(sessionTTL/3)))); err != nil {
			return nil, err
		}
	}
	lost := 0
	if s.Err() != nil || l.Err() != nil {
		lost = 1
		note += fmt.Sprintf("; the holder's session or lock was LOST: %v / %v", s.Err(), l.Err())
	}
	if err := l.Release(ctx); err != nil && lost == 0 {
		return nil, fmt.Errorf("failover: release: %w", err)
	}
	slices.Sort(took)
	var rounds []Value
	for _, d := range took {
		rounds = append(rounds, ms(d))
	}
	third := float64(sessionTTL/3) / float64(time.Millisecond)
	rows := []Row{
		{Scenario: scFailover, N: len(took), Metric: MetricFailoverP50, Lockd: percentile(took, 50), LockdRounds: rounds, Note: note},
		{Scenario: scFailover, N: len(took), Metric: MetricFailoverP99, Lockd: percentile(took, 99), LockdRounds: rounds, Note: note},
		{Scenario: scFailover, N: len(took), Metric: MetricAlive, Lockd: Value(1 - lost), Note: note},
	}
	lockdAtMost(&rows[0], third)
	lockdAtMost(&rows[1], third)
	lockdAtLeast(&rows[2], 1)
	return rows, nil
}

// heartbeats watches the SDK's KeepAlive streams (a stream client
// interceptor): the receipt time and replica of the latest heartbeat answer
// that said live.
type heartbeats struct {
	mu   sync.Mutex
	at   time.Time
	peer string
}

func (h *heartbeats) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != lockdv1.LockService_KeepAlive_FullMethodName {
		return cs, err
	}
	return &heartbeatStream{ClientStream: cs, h: h}, nil
}

// since returns the receipt time of the first live answer from a replica
// other than not received after t, if there is one yet.
func (h *heartbeats) since(t time.Time, not string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.at, h.at.After(t) && h.peer != not
}

type heartbeatStream struct {
	grpc.ClientStream
	h *heartbeats
}

func (s *heartbeatStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*lockdv1.KeepAliveResponse); ok && err == nil && liveAnswer(r) {
		now, from := time.Now(), ""
		if p, ok := peer.FromContext(s.Context()); ok && p.Addr != nil {
			from = p.Addr.String()
		}
		s.h.mu.Lock()
		if s.h.at.IsZero() || s.h.at.Before(now) {
			s.h.at, s.h.peer = now, from
		}
		s.h.mu.Unlock()
	}
	return err
}

// liveAnswer reports whether r answers a heartbeat live, or is a batch
// message with such an answer (C2 #ct2-keepalive-batch).
func liveAnswer(r *lockdv1.KeepAliveResponse) bool {
	if r.GetLive() && r.GetRequestId() != 0 && r.GetError() == nil {
		return true
	}
	for _, a := range r.GetBatch() {
		if liveAnswer(a) {
			return true
		}
	}
	return false
}

// killAndWait SIGKILLs k and returns how long after the signal a heartbeat
// of s was answered live by another replica (hb), bounded by the session's
// TTL: a session that did not move in time failed the scenario.
func killAndWait(ctx context.Context, k *child, s *client.Session, hb *heartbeats) (time.Duration, error) {
	start := time.Now()
	if err := k.cmd.Process.Signal(os.Kill); err != nil {
		return 0, err
	}
	k.stop() // waits for the exit
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(sessionTTL)
	defer limit.Stop()
	for {
		if at, ok := hb.since(start, k.addr); ok {
			return at.Sub(start), nil
		}
		if err := s.Err(); err != nil {
			return 0, fmt.Errorf("the holder's session ended: %w", err)
		}
		select {
		case <-tick.C:
		case <-limit.C:
			return 0, errors.New("no heartbeat answered within the session TTL")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// failoverClient is an SDK client of several replicas (client.New with a
// comma-separated list, C2 #ct2-failover): it talks to the first that
// answers and moves to another when its replica dies.
func failoverClient(addrs []string, dial ...grpc.DialOption) (*client.Client, error) {
	return client.New(strings.Join(addrs, ","), client.WithDialOptions(dial...))
}
