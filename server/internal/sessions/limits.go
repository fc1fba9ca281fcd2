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

// AdmitOpen admits one OpenSession call of principal ("" for an anonymous
// caller), or refuses it (*LimitError) when MaxSessionOpens calls are in
// progress, MaxSessions sessions are kept (counting those being opened), or
// — when share > 0 (a per-principal share is in force, C5
// #ct5-principal-limits) — principal holds share sessions (counting its
// opens in progress). The returned release must be called once the call
// has opened its session (Open) or failed.
func (t *Table) AdmitOpen(principal string, share int) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.opens >= t.cfg.MaxSessionOpens:
		return nil, &LimitError{Limit: wireerr.LimitSessionOpens, N: t.opens}
	case len(t.recs)+t.opens >= t.cfg.MaxSessions:
		return nil, &LimitError{Limit: wireerr.LimitSessions, N: t.cfg.MaxSessions}
	case share > 0 && t.byPrincipal[principal]+t.opensBy[principal] >= share:
		return nil, &LimitError{Limit: wireerr.LimitPrincipalSessions, N: share}
	}
	t.opens++
	t.opensBy[principal]++
	return func() {
		t.mu.Lock()
		t.opens--
		if t.opensBy[principal]--; t.opensBy[principal] <= 0 {
			delete(t.opensBy, principal)
		}
		t.mu.Unlock()
	}, nil
}

// PrincipalSessions is the number of sessions bound to principal that the
// table keeps (principal known), without opens in progress.
func (t *Table) PrincipalSessions(principal string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byPrincipal[principal]
}

// setPrincipalLocked binds r to p once and counts it (t.mu held; a
// session's principal never changes).
func (t *Table) setPrincipalLocked(r *Record, p string) {
	if r.principalKnown {
		return
	}
	r.principal, r.principalKnown = p, true
	t.byPrincipal[p]++
}

// forgetPrincipalLocked uncounts r, dropped from the table (t.mu held).
func (t *Table) forgetPrincipalLocked(r *Record) {
	if !r.principalKnown {
		return
	}
	if t.byPrincipal[r.principal]--; t.byPrincipal[r.principal] <= 0 {
		delete(t.byPrincipal, r.principal)
	}
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
