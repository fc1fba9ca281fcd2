package pgstore

import (
	"errors"
	"slices"
	"testing"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// TestGroupCommitSameKeyWaits sends requests for one key while the first
// is in flight: each goes in a batch of its own, in arrival order, so a
// TryInsert that arrives after a waiter does not jump the waiter's queue.
func TestGroupCommitSameKeyWaits(t *testing.T) {
	t.Parallel()
	s, rec, _ := gcStore(t)
	holder, waiter, barger, other := openSession(t, s), openSession(t, s), openSession(t, s), openSession(t, s)

	release := blockTable(t, s, "locks")
	first := make(chan error, 1)
	go func() {
		_, ok, err := s.TryInsert(testCtx(t), holder, "sk/k")
		if err == nil && !ok {
			err = errors.New("not acquired")
		}
		first <- err
	}()
	waitAllSubmitted(t, s, rec, 1)
	acq := make(chan error, 1)
	go func() {
		_, err := s.Acquire(testCtx(t), waiter, "sk/k")
		acq <- err
	}()
	waitAllSubmitted(t, s, rec, 2)
	if q := s.lockQ.Queued(); q != 1 {
		t.Fatalf("%d requests queued, want the waiter's (its key is in flight)", q)
	}
	bargeRes := make(chan error, 1)
	go func() {
		_, ok, err := s.TryInsert(testCtx(t), barger, "sk/k")
		if err == nil && ok {
			err = errors.New("acquired")
		}
		bargeRes <- err
	}()
	otherRes := make(chan error, 1)
	go func() {
		_, _, err := s.TryInsert(testCtx(t), other, "sk/other")
		otherRes <- err
	}()
	waitAllSubmitted(t, s, rec, 4)
	release()
	if err := <-first; err != nil {
		t.Fatalf("first TryInsert: %v", err)
	}
	if err := <-bargeRes; err != nil {
		t.Fatalf("TryInsert after a queued waiter: %v; want not acquired", err)
	}
	if err := <-otherRes; err != nil {
		t.Fatalf("TryInsert of another key: %v", err)
	}
	waitersAreT(t, s, "sk/k", []store.SessionID{waiter})

	batches, _ := rec.sent()
	var order []store.SessionID
	for _, b := range batches {
		n := 0
		for _, r := range b {
			if r.key == "sk/k" {
				n++
				order = append(order, r.id)
			}
		}
		if n > 1 {
			t.Fatalf("batch %v holds sk/k %d times", b, n)
		}
	}
	if want := []store.SessionID{holder, waiter, barger}; !slices.Equal(order[:3], want) {
		t.Fatalf("sk/k went out for %v, want %v (arrival order)", order, want)
	}
	info, _ := inspectT(t, s, "sk/k")
	if err := s.DeleteIfOwner(testCtx(t), holder, "sk/k", info.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if err := <-acq; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

// TestGroupCommitLoneRequestGoesAtOnce: with nothing else going on, a
// request is sent as a batch of its own while its caller is still the only
// one waiting: nothing holds it back for company.
func TestGroupCommitLoneRequestGoesAtOnce(t *testing.T) {
	t.Parallel()
	s, rec, reg := gcStore(t)
	id := openSession(t, s)
	release := blockTable(t, s, "locks")
	done := make(chan error, 1)
	go func() {
		_, _, err := s.TryInsert(testCtx(t), id, "lone")
		done <- err
	}()
	// The batch is sent (and then waits for the table) with no other
	// request ever submitted.
	waitSent(t, rec, 1)
	if q := s.lockQ.Queued(); q != 0 {
		t.Fatalf("%d requests still queued", q)
	}
	batches, _ := rec.sent()
	if len(batches) != 1 || len(batches[0]) != 1 || batches[0][0].key != "lone" {
		t.Fatalf("batches %v, want one batch of the lone request", batches)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("TryInsert: %v", err)
	}
	if b, r := batchSizes(t, reg, telemetry.BatchLocks); b != 1 || r != 1 {
		t.Fatalf("lockd_backend_batch_size{batch=locks}: %v batches of %v requests, want 1 of 1", b, r)
	}
}
