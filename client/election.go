package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Leader election (docs/contracts/C2.md #ct2-election) is the exclusive lock
// named by the election's name, nothing more: candidates queue for it in
// FIFO order, the leader is its holder, the leader's value is the grant's
// value and its fencing token is the grant's token. Access rules apply as
// for any lock: campaigning needs lock on the name, observing needs read.

// Leadership is a won election: the session holds the election's lock. It
// is trusted until Done closes, exactly like the Lock it is (its session's
// deadline passed, the lock was revoked or lost, or it resigned).
type Leadership struct {
	l *Lock

	mu    sync.Mutex
	value []byte
}

// Campaign waits in the FIFO queue of the election name until this session
// is its leader, then returns the Leadership; value is published with it
// (Observe reports it; at most 4096 bytes, empty allowed). It returns when
// elected, when ctx ends, or when the session ends. Options are those of
// Acquire (WithWaitTimeout); WithValue is value's.
//
// Candidates become leader in the order they started campaigning; each new
// leader's token is higher than every earlier leader's. Pass Token to the
// resources the leader writes to, so that they reject a deposed leader.
func (s *Session) Campaign(ctx context.Context, name string, value []byte, opts ...AcquireOption) (*Leadership, error) {
	l, err := s.Acquire(ctx, name, append(slices.Clone(opts), WithValue(value))...)
	if err != nil {
		return nil, fmt.Errorf("campaign: %w", err)
	}
	return &Leadership{l: l, value: slices.Clone(value)}, nil
}

// Name returns the election's name (its key).
func (e *Leadership) Name() string { return e.l.Key() }

// Token returns the leader's fencing token: the grant's, strictly higher
// than every earlier leader's of this election. Proclaim keeps it.
func (e *Leadership) Token() uint64 { return e.l.Token() }

// Done is closed when the leadership can no longer be trusted (see
// Lock.Done); stop acting as leader at once.
func (e *Leadership) Done() <-chan struct{} { return e.l.Done() }

// Context returns a context that is cancelled when Done closes; its cause is
// Err.
func (e *Leadership) Context() context.Context { return e.l.Context() }

// Err is nil while the leadership is trusted; afterwards it says why not
// (ErrReleased after Resign, ErrLockLost, or the session's error).
func (e *Leadership) Err() error { return e.l.Err() }

// Value returns the value this leader last published (Campaign, Proclaim).
func (e *Leadership) Value() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.value)
}

// Proclaim replaces the leader's value without giving up the leadership: the
// token stays, no other candidate gets a turn, and observers see the new
// value. It fails with ErrLockLost once the leadership is gone (never
// campaigning again by itself). Retryable errors are retried until ctx ends.
func (e *Leadership) Proclaim(ctx context.Context, value []byte) error {
	err := e.l.SetValue(ctx, value)
	if errors.Is(err, ErrNotOwner) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	if err != nil {
		return fmt.Errorf("proclaim: %w", err)
	}
	e.mu.Lock()
	e.value = slices.Clone(value)
	e.mu.Unlock()
	return nil
}

// Resign gives up the leadership (Done closes first): the next candidate in
// the queue becomes leader at once. It is Lock.Release, with its retry
// rules.
func (e *Leadership) Resign(ctx context.Context) error {
	if err := e.l.Release(ctx); err != nil {
		return fmt.Errorf("resign: %w", err)
	}
	return nil
}

// Observation is what Observe reports: the election's leader, or that it
// has none.
type Observation struct {
	// Name is the election's name.
	Name string
	// Leader is false when the election has no leader; the fields up to
	// Value are then empty.
	Leader bool
	// Session is the leader's session, Token its fencing token.
	Session string
	Token   uint64
	// Owner and Labels are the leader session's (WithOwner); Value is what
	// the leader published (Campaign, Proclaim).
	Owner  string
	Labels map[string]string
	Value  []byte
	// Err is set only on the last observation before the channel closes
	// because Observe could not go on (a refusal such as
	// ErrPermissionDenied); never when ctx ends or the client closes.
	Err error
}

func (o Observation) same(p Observation) bool {
	return o.Leader == p.Leader && o.Session == p.Session && o.Token == p.Token && o.Owner == p.Owner &&
		maps.Equal(o.Labels, p.Labels) && bytes.Equal(o.Value, p.Value)
}

// Observe reports the leader of the election name as it changes: first the
// current leader (or no leader), then every change — a new leader, a new
// value of the leader (Proclaim), and no leader whenever the election has
// none (the leader resigned, was revoked or lost its session, and nobody
// took over yet) — in commit order, without repeating an observation.
//
// It is built on Watch(name, WithHolders()) and one Inspect after the watch
// is established, and never polls. After a resync (EventResync) the
// election is read again. When the watch breaks it is established
// again (with backoff, until ctx ends) and the election read again, so
// changes meanwhile are reported as one transition: a leader may be
// skipped, and the tokens of the leaders reported only rise. Right after it
// starts or resumes on an election without a leader, it may report a
// leader that had already gone (from an event committed before the read),
// followed by no leader.
//
// An observation is what the server said a moment ago, for routing and
// display; only the leader's own Leadership.Done is a safety signal. The
// channel closes when ctx ends or the client closes, or after an
// observation with Err set when Observe cannot go on. Observe returns an
// error if the first watch cannot be established.
func (c *Client) Observe(ctx context.Context, name string) (<-chan Observation, error) {
	if err := validateKey(name); err != nil {
		return nil, fmt.Errorf("observe %q: %w", name, err)
	}
	events, err := c.Watch(ctx, name, WithHolders())
	if err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	out := make(chan Observation)
	c.wg.Add(1)
	go func() { // exits when ctx ends, the client closes, or a final error was sent
		defer c.wg.Done()
		defer close(out)
		o := observer{c: c, name: name, out: out}
		if err := o.run(ctx, events); err != nil && ctx.Err() == nil {
			select {
			case out <- Observation{Name: name, Err: fmt.Errorf("observe %q: %w", name, err)}:
			case <-ctx.Done():
			case <-c.ctx.Done():
			}
		}
	}()
	return out, nil
}

// observer follows one election for Observe.
type observer struct {
	c    *Client
	name string
	out  chan<- Observation
	cur  Observation // what the events say now
	last *Observation
	// top is the highest leader token seen: an acquired or value event
	// below it is from before a read that saw past it.
	top uint64
}

// run reads the election and follows its events; when the watch breaks it
// watches again. It returns nil when ctx ends, else why it cannot go on.
func (o *observer) run(ctx context.Context, events <-chan Event) error {
	for {
		info, err := o.c.Inspect(ctx, o.name)
		if err != nil {
			return err
		}
		o.cur = Observation{Name: o.name}
		if info.Held && info.Token >= o.top {
			o.cur = Observation{Name: o.name, Leader: true, Session: info.Session, Token: info.Token,
				Owner: info.Owner, Labels: info.Labels, Value: info.Value}
			o.top = info.Token
		}
		if !o.emit(ctx) {
			return nil
		}
		resync := false
		for ev := range events {
			if ev.Err != nil {
				break // watch again
			}
			if ev.Kind == EventResync {
				resync = true // events may have been missed: read again
				break
			}
			if ev.Key == o.name && o.apply(ev) && !o.emit(ctx) {
				return nil
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if o.c.ctx.Err() != nil {
			return nil // the client closed
		}
		if resync {
			continue // the watch goes on
		}
		// c.Watch retries until established, ctx ends or a refusal.
		events, err = o.c.Watch(ctx, o.name, WithHolders())
		if err != nil {
			return err
		}
	}
}

// apply folds one event of the election's key into cur; it reports whether
// cur may have changed. Events of grants older than the one cur describes
// (delivered after the Inspect that already saw past them) are skipped.
func (o *observer) apply(ev Event) bool {
	leader := func() bool {
		if ev.Token <= o.top {
			return false
		}
		o.cur = Observation{Name: o.name, Leader: true, Session: ev.Session, Token: ev.Token,
			Owner: ev.Owner, Labels: ev.Labels, Value: ev.Value}
		o.top = ev.Token
		return true
	}
	switch ev.Kind {
	case EventAcquired:
		return leader()
	case EventValue:
		if o.cur.Leader && ev.Token == o.cur.Token {
			o.cur.Value = ev.Value
			return true
		}
		return leader()
	case EventReleased, EventExpired, EventRevoked, EventMaxHold:
		if o.cur.Leader && ev.Token >= o.cur.Token {
			o.cur = Observation{Name: o.name}
			return true
		}
	}
	return false
}

// emit sends cur unless it repeats the last observation sent; false when
// ctx ended first.
func (o *observer) emit(ctx context.Context) bool {
	if o.last != nil && o.cur.same(*o.last) {
		return true
	}
	obs := o.cur
	obs.Labels, obs.Value = maps.Clone(obs.Labels), slices.Clone(obs.Value)
	select {
	case o.out <- obs:
		o.last = &obs
		return true
	case <-ctx.Done():
		return false
	case <-o.c.ctx.Done():
		return false
	}
}
