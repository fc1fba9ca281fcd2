package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"lock.dev/lockd/client"
	"lock.dev/lockd/store"
)

// lockd run --all K1 K2 … -- CMD (C5 #ct5-run-keys, C2 #ct2-acquire-all):
// every key held at once, or none.

// Environment variables lockd run --all sets for its command instead of
// LOCKD_KEY and LOCKD_FENCING_TOKEN (reserved in C5).
const (
	EnvKeyCount      = "LOCKD_KEY_COUNT"
	EnvKeyN          = "LOCKD_KEY_"           // + i, 1..n
	EnvFencingTokenN = "LOCKD_FENCING_TOKEN_" // + i, 1..n
	EnvFencingTokens = "LOCKD_FENCING_TOKENS" // the n tokens, space-separated
)

// splitRunAllArgs splits K1 [K2 …] -- CMD [ARGS...]: with --all every
// argument before the first "--" is a key, and "--" is required.
func splitRunAllArgs(args []string) (keys, argv []string, err error) {
	i := slices.Index(args, "--")
	switch {
	case i < 0:
		return nil, nil, usageErrorf("--all: want K1 [K2 ...] -- CMD [ARGS...], got no \"--\" (with --all every argument before \"--\" is a key)")
	case i == 0:
		return nil, nil, usageErrorf("--all: want K1 [K2 ...] -- CMD [ARGS...], got no key")
	case i == len(args)-1:
		return nil, nil, usageErrorf("--all: want K1 [K2 ...] -- CMD [ARGS...], got no CMD")
	}
	keys = args[:i]
	if err := store.ValidateKeys(keys); err != nil {
		return nil, nil, usageErrorf("--all: %v", err)
	}
	return keys, args[i+1:], nil
}

// checkAllFlags refuses the one-key flags with --all: several keys are
// plain locks only.
func (rf *runFlags) checkAllFlags() error {
	if rf.limit > 1 || rf.shared || rf.exclusive || rf.lockDelay > 0 || rf.maxHold > 0 {
		return usageErrorf("--limit, --shared, --exclusive, --lock-delay and --max-hold do not combine with --all (several keys are plain locks only)")
	}
	return nil
}

// lockSet is the held of a run with several keys: lost when any of its
// locks is. Its goroutines stop with stop.
type lockSet struct {
	keys  []string
	locks []*client.Lock
	done  chan struct{}
	quit  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newLockSet(keys []string, locks []*client.Lock) *lockSet {
	ls := &lockSet{keys: keys, locks: locks, done: make(chan struct{}), quit: make(chan struct{})}
	for _, l := range locks {
		ls.wg.Go(func() { // exits when l is lost or stop is called
			select {
			case <-l.Done():
				ls.once.Do(func() { close(ls.done) })
			case <-ls.quit:
			}
		})
	}
	return ls
}

func (ls *lockSet) stop() {
	close(ls.quit)
	ls.wg.Wait()
}

func (ls *lockSet) Done() <-chan struct{} { return ls.done }

// Err is the first lost lock's error, naming its key.
func (ls *lockSet) Err() error {
	for _, l := range ls.locks {
		if err := l.Err(); err != nil {
			return fmt.Errorf("%q: %w", l.Key(), err)
		}
	}
	return nil
}

// Token is the first key's token (for status lines; CMD gets them all).
func (ls *lockSet) Token() uint64 { return ls.locks[0].Token() }

// lockEnv is what CMD's environment gets for the lock(s) l.
func (r *runner) lockEnv(l held) []string {
	ls, ok := l.(*lockSet)
	if !ok {
		return []string{EnvKey + "=" + r.key, EnvFencingToken + "=" + strconv.FormatUint(l.Token(), 10)}
	}
	env := []string{EnvKeyCount + "=" + strconv.Itoa(len(ls.keys))}
	tokens := make([]string, len(ls.locks))
	for i, l := range ls.locks {
		n := strconv.Itoa(i + 1)
		tokens[i] = strconv.FormatUint(l.Token(), 10)
		env = append(env, EnvKeyN+n+"="+ls.keys[i], EnvFencingTokenN+n+"="+tokens[i])
	}
	return append(env, EnvFencingTokens+"="+strings.Join(tokens, " "))
}

// withoutRunVars drops every variable lockd run sets from environ.
func withoutRunVars(environ []string) []string {
	out := withoutVars(environ, EnvKey, EnvFencingToken, EnvOwner, EnvKeyCount, EnvFencingTokens)
	return slices.DeleteFunc(out, func(kv string) bool {
		return strings.HasPrefix(kv, EnvKeyN) || strings.HasPrefix(kv, EnvFencingTokenN)
	})
}

// runAll acquires every key, runs CMD under them and releases them.
func (r *runner) runAll(ctx context.Context, c *client.Client, s *client.Session) error {
	locks, err := r.acquireAll(ctx, s)
	if err != nil {
		return err
	}
	set := newLockSet(r.keys, locks)
	code, err := r.runLocked(ctx, set)
	set.stop()
	var live []*client.Lock
	for _, l := range locks {
		if l.Err() == nil {
			live = append(live, l)
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.flags.cf.timeout)
	if rerr := client.ReleaseAll(rctx, live); rerr != nil {
		fmt.Fprintf(r.e.stderr, "lockd run: release: %v (the locks are freed when the session closes or expires)\n", rerr)
	}
	cancel()
	if err != nil {
		return err
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// acquireAll takes every key, honouring --wait (no status line: the wait
// is for a set).
func (r *runner) acquireAll(ctx context.Context, s *client.Session) ([]*client.Lock, error) {
	if !r.waitForever && r.flags.wait == 0 {
		var locks []*client.Lock
		err := r.flags.cf.call(ctx, func(ctx context.Context) error {
			var err error
			locks, err = s.TryAcquireAll(ctx, r.keys)
			return err
		})
		if errors.Is(err, client.ErrLocked) {
			code := r.flags.conflictCode
			if code == 0 {
				return nil, &exitError{code: 0} // quietly skipped
			}
			return nil, &exitError{code: code, err: fmt.Errorf("one of %q is locked (--wait 0: not waiting, nothing held)", r.keys)}
		}
		return locks, r.unavailable(ctx, err)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !r.waitForever {
		actx, cancel = context.WithTimeout(actx, r.flags.wait)
		defer cancel()
	}
	locks, err := s.AcquireAll(actx, r.keys)
	switch {
	case err == nil:
		return locks, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("interrupted while waiting for %q: %w", r.keys, err)
	case errors.Is(err, context.DeadlineExceeded) && !r.waitForever:
		return nil, &exitError{code: ExitWaitTimeout, err: fmt.Errorf("timed out after --wait %v waiting for %q (nothing held)", r.flags.wait, r.keys)}
	case errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrSessionExpired):
		return nil, &exitError{code: ExitUnavailable, err: fmt.Errorf("lockd server at %s unavailable while waiting for %q: %w", r.flags.cf.server, r.keys, err)}
	}
	return nil, r.flags.cf.explain(ctx, err)
}
