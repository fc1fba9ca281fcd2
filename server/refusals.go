package server

import (
	"context"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/peer"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// The refusal rate (C2 #ct2-limits, limit refusals): each peer — its
// authenticated principal, else its remote IP address — has a token bucket
// of Config.RefusalRate refusals per second (burst refusalBurstSeconds ×
// the rate). A refusal for access takes a token; once the bucket is empty
// the refusal is answered LIMIT refusals instead, counted and not logged
// one by one. Calls that access control allows never touch a bucket.

const (
	// refusalBurstSeconds: a bucket holds this many seconds of refusals.
	refusalBurstSeconds = 10
	// maxRefusalPeers bounds the buckets kept; beyond it full buckets are
	// forgotten first, and new peers share overflow while none is.
	maxRefusalPeers = 10000
)

// refusals holds the per-peer buckets. The zero rate switches it off.
type refusals struct {
	limit rate.Limit
	burst int

	mu       sync.Mutex
	peers    map[string]*rate.Limiter
	overflow *rate.Limiter
}

func newRefusals(perSecond int) *refusals {
	if perSecond <= 0 {
		return &refusals{}
	}
	r := &refusals{limit: rate.Limit(perSecond), burst: perSecond * refusalBurstSeconds, peers: map[string]*rate.Limiter{}}
	r.overflow = rate.NewLimiter(r.limit, r.burst)
	return r
}

// allow takes a token from the bucket of peer key and reports whether the
// refusal may be answered as such (true) or must be answered LIMIT.
func (r *refusals) allow(key string) bool {
	if r.peers == nil {
		return true // off
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.peers[key]
	if l == nil {
		if len(r.peers) >= maxRefusalPeers {
			for k, pl := range r.peers {
				if pl.TokensAt(now) >= float64(r.burst) {
					delete(r.peers, k) // full again: it forgot nothing
				}
			}
		}
		if len(r.peers) >= maxRefusalPeers {
			return r.overflow.AllowN(now, 1)
		}
		l = rate.NewLimiter(r.limit, r.burst)
		r.peers[key] = l
	}
	return l.AllowN(now, 1)
}

// refusalPeer is the bucket key of the caller of ctx: its authenticated
// principal ("p:" + name), else its remote IP address ("a:" + IP).
func refusalPeer(ctx context.Context, principal string) string {
	if principal != "" && principal != auth.Anonymous {
		return "p:" + principal
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "a:"
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	return "a:" + addr
}

// errRefusalLimit is the message of a refusal answered LIMIT refusals.
const errRefusalLimit = "limit reached: too many refused calls from this peer (lock.server.refusal-rate); slow down"

// overRefusals takes a token for a refusal of the caller of ctx (principal
// as identified, "" if unknown) and reports whether the peer is over its
// refusal rate; it then counts the LIMIT refusal.
func (s *Server) overRefusals(ctx context.Context, principal string) bool {
	if s.refused.allow(refusalPeer(ctx, principal)) {
		return false
	}
	s.lim.met.Rejected(wireerr.LimitRefusals)
	return true
}
