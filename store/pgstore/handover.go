package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/store"
)

// The hand-over in a plain release (C2 #ct2-release-handover, issue 24).
// A lock batch's releases take their keys' locks with its grants
// (execLockBatch); the statement that deletes the released grants
// (releaseBatch) also grants each key it freed to its first live queued
// session, drawing its token under that lock, and takes it out of the
// queue. Once the batch has committed, the waiting Acquire calls of this
// Store that were granted are told from the result (tellHandOvers): they
// answer without the notification and without an attempt of their own.
// Waiters of other Stores learn from the released event, whose attempt
// finds the key held (acquireDone counts it as their grant). A release run
// alone, after its batch failed, hands over nothing: its waiters' own
// attempts take the key, as before. A release that deleted nothing (not
// the owner's) hands over nothing either.

// queueReleases queues, in batch b after keyLock, the releases of keys
// (sessions, tokens alike) with their hand-over, one statement
// (releaseBatch): the grants it deleted go to released (their acquired-at)
// and those it handed over to handed, by key.
func (s *Store) queueReleases(b *pgx.Batch, keys, sessions []string, tokens []int64, released map[string]time.Time, handed map[string]*store.Grant) {
	b.Queue(s.q.releaseBatch, keys, sessions, tokens).Query(func(rows pgx.Rows) error {
		var (
			key   string
			at    time.Time
			sid   *string
			tok   *int64
			hat   *time.Time
			remUS *int64
		)
		_, err := pgx.ForEachRow(rows, []any{&key, &at, &sid, &tok, &hat, &remUS}, func() error {
			released[key] = at
			if sid != nil && tok != nil && hat != nil && remUS != nil { // handed over
				handed[key] = &store.Grant{Key: key, Session: store.SessionID(*sid), Token: uint64(*tok), AcquiredAt: *hat,
					Remaining: max(time.Duration(*remUS)*time.Microsecond, 0)}
			}
			return nil
		})
		return err
	})
}

// handOvers are the grants the releases of a run batch handed over.
func handOvers(reqs []*lockReq) []store.Grant {
	var gs []store.Grant
	for _, r := range reqs {
		if r.err == nil && r.out == freed && r.handed != nil {
			gs = append(gs, *r.handed)
		}
	}
	return gs
}

// tellHandOvers tells this Store's waiters the hand-overs of a committed
// batch.
func (s *Store) tellHandOvers(handed []store.Grant) {
	for _, g := range handed {
		if s.onHandOver != nil {
			s.onHandOver(g.Key)
		}
		s.tellHandOver(g)
	}
}

// tellHandOver tells this Store's waiting Acquire calls of g's session for
// g's key that a release's commit granted them g (C2
// #ct2-release-handover), and wakes them: they answer g without the
// notification and without another attempt. A call that already returned
// (the notification's attempt found the grant first) is no longer
// registered, so nothing answers twice.
func (s *Store) tellHandOver(g store.Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.waiters[g.Key] {
		if w.session != g.Session || w.handed != nil {
			continue
		}
		h := g
		w.handed = &h
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// takeHanded is the grant w was told of, if any.
func (s *Store) takeHanded(w *waiter) (store.Grant, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.handed == nil {
		return store.Grant{}, false
	}
	return *w.handed, true
}
