// Package storetest is the conformance suite every store backend passes
// unchanged (C2 #ct2-spi). A backend's test file is a few lines:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Config{Namespace: ..., ExpirySlack: ..., Expire: ...})
//	}
//
// Each subtest gets a fresh, isolated namespace on the backend (a database,
// a key prefix) and opens one or two independent store instances on it; two
// instances stand in for two lockd replicas sharing the backend. Subtests run
// in parallel.
package storetest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// Config describes the backend under test.
type Config struct {
	// Namespace is called once per subtest. It prepares a fresh namespace on
	// the backend and returns a function that opens a new, independent store
	// instance over that namespace each time it is called. Instances and
	// the namespace are cleaned up through t.Cleanup; the suite also calls
	// Close on the instances it opens (Close must be idempotent).
	Namespace func(t *testing.T) (open func(t *testing.T) store.LockStore)

	// ExpirySlack is how long after its TTL a session that nobody keeps
	// alive may still hold its locks: the PostgreSQL reaper interval, etcd's
	// lease expiry check. The suite allows ExpirySlack plus a fixed margin.
	ExpirySlack time.Duration

	// Expire makes the backend expire the session out of band, as if its
	// TTL had run out with nobody keeping it alive (etcd: revoke its lease
	// through the etcd API; PostgreSQL: move expires_at into the past so the
	// reaper takes it). s is the instance that opened the session. The
	// backend's normal machinery must then notice: the session becomes
	// not-live and its locks go away within ExpirySlack plus a margin.
	Expire func(t *testing.T, s store.LockStore, id store.SessionID)

	// HoldCommit holds s's next commit that carries key (a grant attempt,
	// a queue entry) before it reaches the backend, until open is called
	// (at the latest when the subtest ends); held receives once it is held.
	// settling receives each time a call on s waits for a commit of key
	// already in flight: a LeaveQueue settling the key, or a cut call
	// waiting for its own attempt (C2 #ct2-leave-after-cut); it holds the
	// first 16 unread. HoldCommitWith builds it from a backend's hooks.
	HoldCommit func(t *testing.T, s store.LockStore, key string) (held <-chan struct{}, open func(), settling <-chan struct{})
}

// TTL is the TTL of sessions that a subtest lets die by stopping the
// instance that keeps them: the smallest one allowed, so expiry is quick.
const TTL = store.MinTTL

// LongTTL is the TTL of every other session. It is long because on backends
// where only Heartbeat extends a session (PostgreSQL) the suite does not
// heartbeat, and a session must not die in the middle of a subtest that
// did not ask for it.
const LongTTL = time.Minute

// margin is added to every eventual bound on top of the backend's slack.
const margin = 3 * time.Second

// Run runs every conformance subtest against the backend.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.Namespace == nil || cfg.Expire == nil || cfg.HoldCommit == nil {
		t.Fatal("storetest.Run: Config.Namespace, Config.Expire and Config.HoldCommit are required")
	}
	s := &suite{cfg: cfg}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Lifecycle", s.testLifecycle},
		{"CloseIdempotent", s.testCloseIdempotent},
		{"HeartbeatTerminalAfterClose", s.testHeartbeatTerminalAfterClose},
		{"HeartbeatTerminalAfterExpiry", s.testHeartbeatTerminalAfterExpiry},
		{"Exclusivity", s.testExclusivity},
		{"TryInsertIdempotentForHolder", s.testTryInsertIdempotent},
		{"UnknownSessionWritesNothing", s.testUnknownSessionWritesNothing},
		{"DeadSessionWritesNothing", s.testDeadSessionWritesNothing},
		{"SessionDeathReleasesLocks", s.testSessionDeathReleasesLocks},
		{"ExpiredSessionReleasesLocks", s.testExpiredSessionReleasesLocks},
		{"FencingTokensIncrease", s.testFencingTokensIncrease},
		{"FencingTokensIncreaseAcrossReap", s.testFencingAcrossReap},
		{"FencingTokensIncreaseAcrossReinit", s.testFencingAcrossReinit},
		{"DeleteIfOwner", s.testDeleteIfOwner},
		{"FIFO", s.testFIFO},
		{"FIFOCancelledWaiterLeaves", s.testFIFOCancelledWaiterLeaves},
		{"FIFODeadWaiterLeaves", s.testFIFODeadWaiterLeaves},
		{"FIFOKeptPlace", s.testFIFOKeptPlace}, {"LeaveQueue", s.testLeaveQueue},
		{"LeaveQueueAfterCutAttempt", s.testLeaveQueueAfterCutAttempt},
		{"CutWaitLeavesQueue", s.testCutWaitLeavesQueue},
		{"TryInsertDoesNotJumpQueue", s.testTryInsertDoesNotJumpQueue},
		{"AcquireHeldBySelf", s.testAcquireHeldBySelf},
		{"Revoke", s.testRevoke},
		{"InspectAndList", s.testInspectAndList},
		{"LocksOf", s.testLocksOf},
		{"WatchOrder", s.testWatchOrder},
		{"WatchValue", s.testWatchValue},
		{"WatchResume", s.testWatchResume},
		{"BadInput", s.testBadInput},
		{"Cancellation", s.testCancellation},
		{"Deadline", s.testDeadline},
		{"RemainingCountsDown", s.testRemaining},
		{"ExpireLiveElsewhere", s.testExpireLiveElsewhere}, {"ExpireExpired", s.testExpireExpired},
		{"SessionSecretHash", s.testSessionSecretHash},
		{"Holder", s.testHolder},
		{"SessionPrincipal", s.testSessionPrincipal},
		{"SemaphoreLimit", s.testSemaphoreLimit},
		{"SemaphoreFIFO", s.testSemaphoreFIFO},
		{"LimitMismatch", s.testLimitMismatch},
		{"SharedReaders", s.testSharedReaders},
		{"WriterPreference", s.testWriterPreference},
		{"TokensAcrossModes", s.testTokensAcrossModes},
		{"SlotRelease", s.testSlotRelease},
		{"SlotHolderDeath", s.testSlotHolderDeath},
		{"RWExclusivityRace", s.testRWExclusivityRace},
		{"SlotHandOver", s.testSlotHandOver},
		{"ReplicaServesSession", s.testReplicaServesSession},
		{"ReplicaOutlivesOpener", s.testReplicaOutlivesOpener},
		{"ReplicaUnknownSession", s.testReplicaUnknownSession},
		{"ListSessions", s.testListSessions},
		{"LockDelayAfterExpiry", s.testLockDelayAfterExpiry},
		{"LockDelayAfterRevoke", s.testLockDelayAfterRevoke},
		{"LockDelaySkippedOnRelease", s.testLockDelaySkippedOnRelease},
		{"MaxHold", s.testMaxHold},
		{"LockDelayOutlivesOpener", s.testLockDelayOutlivesOpener},
		{"DeadlockTwo", s.testDeadlockTwo},
		{"DeadlockThree", s.testDeadlockThree},
		{"NCycle", s.testDeadlockNCycle},
		{"OptOut", s.testDeadlockOptOut},
		{"DeadlockDissolved", s.testDeadlockDissolved},
		{"DeadlockRW", s.testDeadlockRW},
		{"DeadlockSemaphoreKnot", s.testDeadlockSemaphoreKnot},
		{"DeadlockSemaphoreFreeHolder", s.testDeadlockSemaphoreFreeHolder},
		{"AcquireAllBasics", s.testAcquireAllBasics},
		{"AcquireAllFIFO", s.testAcquireAllFIFO},
		{"AcquireAllOppositeOrders", s.testAcquireAllOppositeOrders},
		{"AcquireAllLeavesNothing", s.testAcquireAllLeavesNothing},
		{"AcquireAllSessionDeath", s.testAcquireAllSessionDeath},
		{"AcquireAllLimits", s.testAcquireAllLimits},
		{"AcquireAllRace", s.testAcquireAllRace},
		{"AcquireAllAtomic", s.testAcquireAllAtomic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

// HoldCommitWith is Config.HoldCommit for a backend whose commits pass
// through a hook with their keys (setHook installs it; nil removes it) and
// whose calls report through a settling hook (setSettling) when they wait
// for commits of a key in flight.
func HoldCommitWith(t *testing.T, key string, setHook func(func(keys []string)), setSettling func(func(key string))) (held <-chan struct{}, open func(), settling <-chan struct{}) {
	heldCh, openCh, settlingCh := make(chan struct{}), make(chan struct{}), make(chan struct{}, 16)
	var holdOnce, openOnce sync.Once
	open = func() { openOnce.Do(func() { close(openCh) }) }
	t.Cleanup(func() {
		open()
		setHook(nil)
		setSettling(nil)
	})
	setHook(func(keys []string) {
		if !slices.Contains(keys, key) {
			return
		}
		hold := false
		holdOnce.Do(func() { hold = true })
		if hold {
			close(heldCh)
			<-openCh
		}
	})
	setSettling(func(k string) {
		if k == key {
			select {
			case settlingCh <- struct{}{}:
			default:
			}
		}
	})
	return heldCh, open, settlingCh
}
