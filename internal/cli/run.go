package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
	"lock.dev/lockd/store"
)

// Environment variables lockd run sets for its command (reserved in C5:
// lockd serve ignores them).
const (
	EnvKey          = "LOCKD_KEY"
	EnvFencingToken = "LOCKD_FENCING_TOKEN"
	EnvOwner        = "LOCKD_OWNER" // only with --owner
)

// Exit codes of lockd run besides CMD's own status and those of every
// command (ExitError, ExitUsage) and ExitLockLost. CMD's status passes
// through unchanged, so these keep away from the codes commands commonly
// return (0–2, 126–165, 255): 69 is sysexits' EX_UNAVAILABLE (like 75, a
// sysexits code), 80 and 81 are outside every convention, 124 is what
// timeout(1) returns when it stopped its command. The table is in run's help,
// the package doc and the README.
const (
	// ExitUnavailable: the server could not be reached (within --timeout)
	// before the lock was held. After that, a server that goes away makes
	// the lock lost (ExitLockLost).
	ExitUnavailable = 69
	// ExitLocked: KEY was held by someone else and --wait 0 was given; the
	// default of --conflict-exit-code.
	ExitLocked = 80
	// ExitWaitTimeout: --wait ran out before the lock was granted.
	ExitWaitTimeout = 81
	// ExitMaxRuntime: CMD ran longer than --max-runtime and was terminated.
	ExitMaxRuntime = 124
)

// Exit codes of lockd run when the command could not be started (the
// shell's conventions).
const (
	exitCannotExec = 126
	exitNotFound   = 127
)

// statusEvery is how often lockd run reads the key while it waits (the
// SDK's WithWaitUpdates: the first read client.WaitUpdateDelay after the
// wait starts) and redraws a terminal status line.
const statusEvery = time.Second

// deadSessionCloseTimeout bounds the best-effort close of a session that
// already ended (its deadline passed, or the server reported it dead).
const deadSessionCloseTimeout = 2 * time.Second

type runFlags struct {
	cf           *clientFlags
	ttl          time.Duration
	wait         time.Duration
	grace        time.Duration
	maxRuntime   time.Duration
	conflictCode int
	owner        string
	limit        uint32
	shared       bool
	exclusive    bool
	lockDelay    time.Duration
	maxHold      time.Duration
	all          bool // several keys (run_all.go)
}

// acquireOpts are the SDK options of --limit, --shared, --exclusive,
// --lock-delay and --max-hold.
func (rf *runFlags) acquireOpts() []client.AcquireOption {
	var opts []client.AcquireOption
	switch {
	case rf.shared:
		opts = append(opts, client.Shared())
	case rf.exclusive:
		opts = append(opts, client.Exclusive())
	case rf.limit > 1:
		opts = append(opts, client.WithLimit(rf.limit))
	}
	if rf.lockDelay > 0 {
		opts = append(opts, client.WithLockDelay(rf.lockDelay))
	}
	if rf.maxHold > 0 {
		opts = append(opts, client.WithMaxHold(rf.maxHold))
	}
	return opts
}

func newRunCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "run [flags] KEY -- CMD [ARGS...]",
		Example: exampleRun,
		Short:   "Run a command while holding a lock",
		Long: `Run acquires the lock KEY, waiting in its FIFO queue, then runs CMD with
LOCKD_KEY and LOCKD_FENCING_TOKEN in its environment, and releases the lock
when CMD exits. It exits with CMD's exit status (128+N if CMD died of signal N).

CMD runs in its own process group; SIGINT and SIGTERM sent to lockd are
forwarded to that group. If the lock is lost while CMD runs (revoked by an
administrator, or its session could no longer be kept alive), the group gets
SIGTERM at once and SIGKILL after --grace, and lockd run exits with status 75.
Pass LOCKD_FENCING_TOKEN to the resource the lock protects, so that it rejects
a holder that was superseded.

--wait bounds how long to wait for the lock: without it lockd run waits as
long as it takes; --wait 0 tries once and fails at once if the key is held.
While waiting, a status line on stderr shows the holder's token and how long it
has held the key, the queue position and, once the server has seen holds of the
key or its template, an estimate of the wait (not a promise); it is read again
every second and updated in place when stderr is a terminal, else printed once.

--max-runtime bounds how long CMD may run once it started (the wait is not
counted): then CMD is stopped as on a lost lock (SIGTERM, SIGKILL after
--grace), the lock is released, and lockd run exits with status 124.

--lock-delay D: if the lock ends without CMD's run releasing it (this run's
session expired or stopped answering, an administrator revoked it, --max-hold
ran out), nobody else is granted KEY for D, so a CMD that has not noticed yet
gets D to stop before another run starts (for resources that cannot check
LOCKD_FENCING_TOKEN). A normal end hands KEY over at once. At most the server's
lock.server.max-lock-delay.

--max-hold D makes the server revoke the lock once it has been held for D
(1s..168h, at most lock.server.max-hold-limit), even if this lockd run is
wedged: CMD is then stopped as on a lost lock and lockd run exits 75.
--max-runtime is enforced by lockd run itself; --max-hold by the server.

--conflict-exit-code N (like flock's -E) is the exit status when KEY is held
and --wait 0 was given. With N = 0 such a run prints nothing: in cron, a run
that overlaps the previous one is skipped quietly. It applies to --wait 0 only:
a --wait that runs out exits 81, so a job that waited in vain stays visible.

--limit N makes KEY a counting semaphore: up to N runs hold it at once, each
with its own LOCKD_FENCING_TOKEN; the others wait in FIFO order. --shared and
--exclusive make KEY a read/write lock: --shared runs hold it together,
an --exclusive run alone, and a waiting --exclusive run blocks later --shared
ones. A writer's token is above every earlier reader's. Every run on one KEY
must agree: another --limit, or --shared/--exclusive on a plain lock (or the
reverse), fails at once with exit status 1 and nothing is queued.

--owner S names this holder (at most 128 bytes, printable): lockd inspect, ls
and other runs' waiting lines show it, CMD gets it as LOCKD_OWNER and run's
status lines on stderr show it. Without --owner the holder is shown as
"HOST (pid PID, CMD)" (and LOCKD_OWNER is not set).

Exit status:
  CMD's      CMD ran: its exit status (128+N if CMD died of signal N)
  1          another error (message on stderr)
  2          usage error
  69         the server could not be reached before the lock was held
             (--timeout), or stopped answering while lockd run waited
  75         the lock was lost while CMD ran; CMD was terminated
  80         KEY was locked and --wait 0 was given (--conflict-exit-code
             changes it)
  81         --wait ran out before the lock was granted
  124        CMD ran longer than --max-runtime; CMD was terminated
  126, 127   CMD could not be executed, or was not found

--all holds several keys at once, or none: lockd run --all K1 K2 -- CMD.
Every argument before "--" is then a key (1 to 64, no key twice) and "--"
is required; without --all the first argument is the one KEY and
everything after it (after an optional "--") is CMD, so "lockd run K cmd
-- x" runs "cmd -- x" under K. The keys are taken in ascending order, each
in its FIFO queue, so runs naming overlapping keys in any order never
deadlock. CMD gets LOCKD_KEY_COUNT, LOCKD_KEY_1.., LOCKD_FENCING_TOKEN_1..
(in the order given) and LOCKD_FENCING_TOKENS (space-separated) instead of
LOCKD_KEY and LOCKD_FENCING_TOKEN. Losing any key stops CMD (exit 75); a
failed --wait holds nothing. Not with --limit, --shared, --exclusive,
--lock-delay or --max-hold.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if all, _ := cmd.Flags().GetBool("all"); all {
				_, _, err := splitRunAllArgs(args)
				return err
			}
			if _, _, err := splitRunArgs(args); err != nil {
				return err
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false) // everything after KEY belongs to CMD
	rf := &runFlags{cf: addClientFlags(cmd, e)}
	cmd.Flags().DurationVar(&rf.ttl, "ttl", 0, "session TTL (2s..1h); 0 uses the server's lock.session.ttl")
	cmd.Flags().DurationVar(&rf.wait, "wait", 0, "give up if the lock is not acquired within this long; 0 tries once (default: wait forever)")
	cmd.Flags().DurationVar(&rf.grace, "grace", 5*time.Second, "after the lock is lost or --max-runtime ran out, how long CMD has between SIGTERM and SIGKILL")
	cmd.Flags().DurationVar(&rf.maxRuntime, "max-runtime", 0, "stop CMD (as on a lost lock) and exit 124 when it runs longer than this (default: no limit)")
	cmd.Flags().IntVar(&rf.conflictCode, "conflict-exit-code", ExitLocked, "exit status when KEY is locked and --wait 0 was given; 0 also silences the message")
	cmd.Flags().Uint32Var(&rf.limit, "limit", 0, "make KEY a counting semaphore of N: up to N runs hold it at once (1..1024; every run on KEY must use the same N)")
	cmd.Flags().BoolVar(&rf.shared, "shared", false, "take KEY as the reader side of a read/write lock (held together with other --shared runs)")
	cmd.Flags().BoolVar(&rf.exclusive, "exclusive", false, "take KEY as the writer side of a read/write lock (alone; blocks later --shared runs while it waits)")
	cmd.Flags().DurationVar(&rf.lockDelay, "lock-delay", 0, "after the lock ends involuntarily (expired, revoked, --max-hold) nobody gets KEY for this long (default: none)")
	cmd.Flags().DurationVar(&rf.maxHold, "max-hold", 0, "the server revokes the lock once held this long (1s..168h; default: no limit)")
	cmd.Flags().BoolVar(&rf.all, "all", false, "every argument before \"--\" is a key: hold them all at once, or none (K1 K2 ... -- CMD)")
	cmd.Flags().StringVar(&rf.owner, "owner", "", "name of this holder (e.g. host/job; default \"HOST (pid PID, CMD)\"), shown by inspect and ls, passed to CMD as "+EnvOwner)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		key, argv, _ := splitRunArgs(args)
		var keys []string
		if rf.all {
			keys, argv, _ = splitRunAllArgs(args)
			key = strings.Join(keys, ", ")
			if err := rf.checkAllFlags(); err != nil {
				return err
			}
		}
		switch {
		case rf.ttl < 0:
			return usageErrorf("--ttl must not be negative")
		case rf.wait < 0:
			return usageErrorf("--wait must not be negative")
		case rf.grace < 0:
			return usageErrorf("--grace must not be negative")
		case rf.maxRuntime < 0:
			return usageErrorf("--max-runtime must not be negative (0: no limit)")
		case rf.shared && rf.exclusive:
			return usageErrorf("--shared and --exclusive exclude each other")
		case (rf.shared || rf.exclusive) && rf.limit > 1:
			return usageErrorf("--limit does not combine with --shared or --exclusive")
		case rf.limit > store.MaxLimit:
			return usageErrorf("--limit must be at most %d, not %d", store.MaxLimit, rf.limit)
		case store.ValidateGrantPolicy(store.GrantPolicy{LockDelay: rf.lockDelay}) != nil:
			return usageErrorf("--lock-delay: %v", store.ValidateGrantPolicy(store.GrantPolicy{LockDelay: rf.lockDelay}))
		case store.ValidateGrantPolicy(store.GrantPolicy{MaxHold: rf.maxHold}) != nil:
			return usageErrorf("--max-hold: %v", store.ValidateGrantPolicy(store.GrantPolicy{MaxHold: rf.maxHold}))
		case (rf.lockDelay > 0 || rf.maxHold > 0) && (rf.shared || rf.exclusive || rf.limit > 1):
			return usageErrorf("--lock-delay and --max-hold apply to plain locks only, not with --limit, --shared or --exclusive")
		case rf.conflictCode < 0 || rf.conflictCode > 255:
			return usageErrorf("--conflict-exit-code must be 0..255, not %d", rf.conflictCode)
		case strings.ContainsAny(rf.owner, "\x00\n\r"):
			return usageErrorf("--owner must not contain NUL or line breaks")
		case store.ValidateOwner(rf.owner) != nil:
			return usageErrorf("--owner: %v", store.ValidateOwner(rf.owner))
		}
		waitForever := !cmd.Flags().Changed("wait")
		if cmd.Flags().Changed("conflict-exit-code") && (waitForever || rf.wait != 0) {
			return usageErrorf("--conflict-exit-code applies with --wait 0 only (a --wait that runs out exits %d)", ExitWaitTimeout)
		}
		r := &runner{e: e, flags: rf, waitForever: waitForever, key: key, keys: keys, argv: argv}
		return r.run(cmd.Context())
	}
	return cmd
}

// splitRunArgs splits KEY [--] CMD [ARGS...].
func splitRunArgs(args []string) (key string, argv []string, err error) {
	if len(args) == 0 {
		return "", nil, usageErrorf("want KEY -- CMD [ARGS...], got nothing")
	}
	key, argv = args[0], args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return "", nil, usageErrorf("want KEY -- CMD [ARGS...], got no CMD")
	}
	return key, argv, nil
}

type runner struct {
	e           *env
	flags       *runFlags
	waitForever bool
	key         string
	keys        []string // --all: every key (run_all.go); key joins them for messages
	argv        []string
	cmdName     string // "elect" for lockd elect; "" is run
}

// held is what runLocked runs a command under: a *client.Lock, or a
// *client.Leadership (lockd elect).
type held interface {
	Done() <-chan struct{}
	Err() error
	Token() uint64
}

// openSession opens the session of a run or an election (owner and TTL
// from the flags) and returns it with the function that closes it.
// Closing the session releases its lock too; it is best effort after the
// release, and brief when the session already ended (the server may well
// be unreachable then).
func (r *runner) openSession(ctx context.Context, c *client.Client) (*client.Session, func(), error) {
	cf := r.flags.cf
	owner := r.flags.owner
	if owner == "" {
		owner = defaultOwner(r.argv)
	}
	sopts := []client.SessionOption{client.WithOwner(owner, nil)}
	if r.flags.ttl > 0 {
		sopts = append(sopts, client.WithSessionTTL(r.flags.ttl))
	}
	var s *client.Session
	err := cf.call(ctx, func(ctx context.Context) error {
		var err error
		s, err = c.NewSession(ctx, sopts...)
		return err
	})
	if err != nil {
		return nil, nil, r.unavailable(ctx, fmt.Errorf("open session: %w", err))
	}
	return s, func() {
		timeout := cf.timeout
		if s.Err() != nil {
			timeout = min(timeout, deadSessionCloseTimeout)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		_ = s.Close(cctx)
	}, nil
}

func (r *runner) run(ctx context.Context) error {
	cf := r.flags.cf
	c, err := cf.dial()
	if err != nil {
		return err
	}
	defer c.Close()

	s, closeSession, err := r.openSession(ctx, c)
	if err != nil {
		return err
	}
	defer closeSession()
	if r.keys != nil {
		return r.runAll(ctx, c, s) // run_all.go
	}

	l, err := r.acquire(ctx, c, s)
	if err != nil {
		return err
	}
	code, err := r.runLocked(ctx, l)

	// Release unless the lock is already gone; a failure here is not the
	// command's: the session's close (deferred) or its expiry frees the key.
	if l.Err() == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cf.timeout)
		if rerr := l.Release(rctx); rerr != nil {
			fmt.Fprintf(r.e.stderr, "lockd run: release %q: %v (the lock is freed when the session closes or expires)\n", r.key, rerr)
		}
		cancel()
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// unavailable gives err exit code ExitUnavailable when it says that the
// server could not be reached in time (a call under --timeout failed
// retrying, or the session's deadline passed without an answer). Other
// errors, and those of a cancelled ctx, are returned as they are.
func (r *runner) unavailable(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	if errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrSessionExpired) || errors.Is(err, context.DeadlineExceeded) {
		return &exitError{code: ExitUnavailable, err: err}
	}
	return err
}

// acquire takes the lock, honouring --wait, and reports the wait on stderr.
func (r *runner) acquire(ctx context.Context, c *client.Client, s *client.Session) (*client.Lock, error) {
	if !r.waitForever && r.flags.wait == 0 {
		var l *client.Lock
		err := r.flags.cf.call(ctx, func(ctx context.Context) error {
			var err error
			l, err = s.TryAcquire(ctx, r.key, r.flags.acquireOpts()...)
			return err
		})
		if errors.Is(err, client.ErrLocked) {
			code := r.flags.conflictCode
			if code == 0 {
				return nil, &exitError{code: 0} // quietly skipped
			}
			holder, _ := r.holder(ctx, c)
			return nil, &exitError{code: code, err: fmt.Errorf("%q is locked%s (--wait 0: not waiting)", r.key, holder)}
		}
		return l, r.unavailable(ctx, err)
	}

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !r.waitForever {
		actx, cancel = context.WithTimeout(actx, r.flags.wait)
		defer cancel()
	}
	st := r.startStatus(ctx)
	l, err := s.Acquire(actx, r.key, append(r.flags.acquireOpts(), client.WithWaitUpdates(statusEvery, st.update))...)
	st.stop(l)
	switch {
	case err == nil:
		return l, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("interrupted while waiting for %q: %w", r.key, err)
	case errors.Is(err, context.DeadlineExceeded) && !r.waitForever:
		// The SDK adds the last retryable answer (ErrUnavailable) to the
		// deadline, even one from long ago: the server is called unavailable
		// only if it does not answer now either.
		holder, ierr := r.holder(ctx, c)
		if errors.Is(err, client.ErrUnavailable) && ierr != nil {
			return nil, &exitError{code: ExitUnavailable, err: fmt.Errorf("lockd server at %s unavailable while waiting for %q: %w", r.flags.cf.server, r.key, err)}
		}
		return nil, &exitError{code: ExitWaitTimeout, err: fmt.Errorf("timed out after --wait %v waiting for %q%s", r.flags.wait, r.key, holder)}
	case errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrSessionExpired):
		return nil, &exitError{code: ExitUnavailable, err: fmt.Errorf("lockd server at %s unavailable while waiting for %q: %w", r.flags.cf.server, r.key, err)}
	}
	return nil, r.flags.cf.explain(ctx, err) // the SDK names the key
}

// holder describes the key's holder for an error message, or "". The error
// is the server's, when it did not answer.
func (r *runner) holder(ctx context.Context, c *client.Client) (string, error) {
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := c.Inspect(ictx, r.key)
	if err != nil || !info.Held {
		return "", err
	}
	return " (" + heldBy(info, time.Now()) + ")", nil
}

// prefix starts run's status lines: "lockd run" (or "lockd elect"), with
// the --owner if given.
func (r *runner) prefix() string {
	name := "lockd run"
	if r.cmdName != "" {
		name = "lockd " + r.cmdName
	}
	if r.flags.owner == "" {
		return name
	}
	return fmt.Sprintf("%s (owner %s)", name, r.flags.owner)
}

// status reports on stderr that lockd run is waiting, from the SDK's wait
// updates (C2 #ct2-wait-updates). On a terminal it keeps one line up to date
// (redrawn every statusEvery, so the holder's time moves on between
// updates); otherwise it prints one line at the first update and one when
// the lock is acquired.
type status struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	last   *client.WaitUpdate // the latest update; nil before the first
	shown  bool               // a line was written
	tty    bool
	w      io.Writer
	prefix string // of every line
	key    string
}

func (r *runner) startStatus(ctx context.Context) *status {
	ctx, cancel := context.WithCancel(ctx)
	st := &status{cancel: cancel, tty: isTerminal(r.e.stderr), w: r.e.stderr, prefix: r.prefix(), key: r.key}
	if !st.tty {
		return st
	}
	st.wg.Add(1)
	go func() { // redraws the terminal line; exits when stop cancels ctx
		defer st.wg.Done()
		t := time.NewTicker(statusEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st.mu.Lock()
			if st.last != nil {
				st.showLocked(*st.last)
			}
			st.mu.Unlock()
		}
	}()
	return st
}

// update is the Acquire's WithWaitUpdates function.
func (st *status) update(u client.WaitUpdate) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.tty && st.shown {
		return // one line only
	}
	st.last = &u
	st.showLocked(u)
}

func (st *status) showLocked(u client.WaitUpdate) {
	line := waitingLine(st.prefix, st.key, u)
	if st.tty {
		fmt.Fprintf(st.w, "\r\x1b[K%s", line)
	} else {
		fmt.Fprintln(st.w, line)
	}
	st.shown = true
}

// stop ends the redraws (the Acquire has returned: no update comes any more)
// and clears or completes the status line.
func (st *status) stop(l *client.Lock) {
	st.cancel()
	st.wg.Wait()
	if !st.shown {
		return
	}
	switch {
	case st.tty:
		fmt.Fprint(st.w, "\r\x1b[K")
	case l != nil:
		fmt.Fprintf(st.w, "%s: acquired %q (token %d)\n", st.prefix, st.key, l.Token())
	}
}

func waitingLine(prefix, key string, u client.WaitUpdate) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: waiting for %q", prefix, key)
	switch {
	case errors.Is(u.Err, client.ErrPermissionDenied):
		b.WriteString(" (no queue position: not allowed to read the key)")
		return b.String()
	case u.Err != nil:
		b.WriteString(" (holder unknown: server not answering)")
		return b.String()
	case u.Info.Held:
		fmt.Fprintf(&b, ": %s", heldBy(u.Info, time.Now()))
	default:
		b.WriteString(": being handed over")
	}
	if u.Position > 0 {
		fmt.Fprintf(&b, ", queue position %d of %d", u.Position, u.Waiters)
	}
	if u.HasEstimate { // absent when the server knows none (C2 #ct2-wait-estimate)
		fmt.Fprintf(&b, ", estimated %.1fs", u.Estimate.Seconds())
	}
	return b.String()
}

// runLocked runs the command while l is held and returns its exit code. If
// the lock is lost meanwhile, or --max-runtime runs out, it terminates the
// command's process group and returns an ExitLockLost or ExitMaxRuntime
// error (a loss wins: it says that the command may have overlapped another
// holder).
func (r *runner) runLocked(ctx context.Context, l held) (int, error) {
	select {
	case <-l.Done():
		return 0, &exitError{code: ExitLockLost, err: fmt.Errorf("lock %q lost before the command started: %w", r.key, l.Err())}
	default:
	}
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env = append(withoutRunVars(r.e.environ()), r.lockEnv(l)...) // run_all.go
	if r.flags.owner != "" {
		cmd.Env = append(cmd.Env, EnvOwner+"="+r.flags.owner)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.e.stdin, r.e.stdout, r.e.stderr
	// A command that exits but leaves its output pipes open (a background
	// grandchild) does not hold up lockd run.
	cmd.WaitDelay = time.Second
	restoreTTY := setProcessGroup(cmd, r.e.stdin)

	// Registered before the start, so no signal slips through unforwarded.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)

	if err := cmd.Start(); err != nil {
		restoreTTY()
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return 0, &exitError{code: code, err: fmt.Errorf("start %s: %w", r.argv[0], err)}
	}
	pgid := cmd.Process.Pid
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }() // ends when the command exits

	var (
		lost, overran bool
		lockDone      = l.Done()
		ctxDone       = ctx.Done()
		killTimer     *time.Timer
		killc         <-chan time.Time
		maxc          <-chan time.Time
	)
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	if r.flags.maxRuntime > 0 {
		maxTimer := time.NewTimer(r.flags.maxRuntime)
		defer maxTimer.Stop()
		maxc = maxTimer.C
	}
	// terminate sends SIGTERM now and SIGKILL after --grace.
	terminate := func() {
		_ = signalGroup(pgid, syscall.SIGTERM)
		if killTimer == nil {
			killTimer = time.NewTimer(r.flags.grace)
			killc = killTimer.C
		}
	}
loop:
	for {
		select {
		case <-waitc:
			break loop
		case sig := <-sigc:
			_ = signalGroup(pgid, sig.(syscall.Signal))
		case <-ctxDone:
			ctxDone = nil
			// main cancels ctx on SIGINT/SIGTERM, which sigc receives as
			// well: then the signal is forwarded as it is, and the command
			// takes the time it needs. A cancellation without a signal
			// terminates the command like a lost lock.
			select {
			case sig := <-sigc:
				_ = signalGroup(pgid, sig.(syscall.Signal))
			case <-time.After(100 * time.Millisecond):
				terminate()
			}
		case <-lockDone:
			lockDone, lost = nil, true
			fmt.Fprintf(r.e.stderr, "%s: lost the lock on %q (token %d): %v; sending SIGTERM to the command, SIGKILL in %v\n",
				r.prefix(), r.key, l.Token(), l.Err(), r.flags.grace)
			terminate()
		case <-maxc:
			maxc, overran = nil, true
			fmt.Fprintf(r.e.stderr, "%s: the command on %q (token %d) reached --max-runtime %v; sending SIGTERM, SIGKILL in %v\n",
				r.prefix(), r.key, l.Token(), r.flags.maxRuntime, r.flags.grace)
			terminate()
		case <-killc:
			killc = nil
			_ = signalGroup(pgid, syscall.SIGKILL)
		}
	}
	restoreTTY()
	if lost || overran {
		// Whatever is left of the group had its SIGTERM; it must not outlive
		// lockd run while someone else may hold the lock (now, or after the
		// release that follows).
		_ = signalGroup(pgid, syscall.SIGKILL)
	}
	switch {
	case lost:
		return 0, &exitError{code: ExitLockLost, err: fmt.Errorf("lock %q lost while the command ran (%v); the command was terminated", r.key, l.Err())}
	case overran:
		return 0, &exitError{code: ExitMaxRuntime, err: fmt.Errorf("the command on %q ran longer than --max-runtime %v and was terminated", r.key, r.flags.maxRuntime)}
	}
	return exitCode(cmd.ProcessState), nil
}

// exitCode is the shell's view of a finished process: its exit status, or
// 128+N when signal N killed it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// withoutVars returns environ without the named variables.
func withoutVars(environ []string, names ...string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
