package sessions

import (
	"fmt"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// LimitError refuses a call at a limit the table counts: Limit is which
// (wireerr.LimitSessions, LimitSessionOpens or LimitLocksPerSession), N the
// count that reached it.
type LimitError struct {
	Limit string
	N     int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("sessions: limit %s reached (%d)", e.Limit, e.N)
}

// AdmitOpen admits one OpenSession call, or refuses it (*LimitError) when
// MaxSessionOpens calls are in progress or MaxSessions sessions are kept
// (counting those being opened). The returned release must be called once
// the call has opened its session (Open) or failed.
func (t *Table) AdmitOpen() (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.opens >= t.cfg.MaxSessionOpens:
		return nil, &LimitError{Limit: wireerr.LimitSessionOpens, N: t.opens}
	case len(t.recs)+t.opens >= t.cfg.MaxSessions:
		return nil, &LimitError{Limit: wireerr.LimitSessions, N: t.cfg.MaxSessions}
	}
	t.opens++
	return func() {
		t.mu.Lock()
		t.opens--
		t.mu.Unlock()
	}, nil
}

// Slot is one admitted Acquire call's place in the in-progress count.
type Slot struct {
	t       *Table
	id      store.SessionID
	counted bool // still counted in Table.acquiring (t.mu)
}

// AdmitAcquire admits one Acquire call of the pinned record r for key, or
// refuses it (*LimitError) when it would take the session past
// MaxLocksPerSession (held keys plus Acquire calls in progress). Asking
// again for a key the session holds is always admitted. The call counts as
// in progress until Grant tracks its grant or Done.
func (t *Table) AdmitAcquire(r *Record, key string) (*Slot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, holds := r.locks[key]
	if n := len(r.locks) + t.acquiring[r.id]; !holds && n >= t.cfg.MaxLocksPerSession {
		return nil, &LimitError{Limit: wireerr.LimitLocksPerSession, N: n}
	}
	t.acquiring[r.id]++
	return &Slot{t: t, id: r.id, counted: true}, nil
}

// heldLocked ends the slot's in-progress count (t.mu held).
func (a *Slot) heldLocked() {
	if !a.counted {
		return
	}
	a.counted = false
	if a.t.acquiring[a.id]--; a.t.acquiring[a.id] <= 0 {
		delete(a.t.acquiring, a.id)
	}
}

// Done ends what Grant did not: called once, when the Acquire returns.
func (a *Slot) Done() {
	a.t.mu.Lock()
	defer a.t.mu.Unlock()
	a.heldLocked()
}
