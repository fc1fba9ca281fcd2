package worker

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"lock.dev/lockd/client"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

// Trust says how a worker decides how long it holds a grant.
type Trust string

const (
	// TrustSDK trusts a grant until the SDK closes Lock.Done (the correct
	// client).
	TrustSDK Trust = "sdk"
	// TrustReceiveTTL trusts a grant for a full session TTL from the
	// receipt of the acquire reply and ignores Done: the timing control
	// (package doc).
	TrustReceiveTTL Trust = "receive-ttl"
	// TrustIgnoreDone trusts a grant until it sends the release, whatever
	// Done and the SDK's deadline say: a semaphore holder that keeps its
	// slot after the slot was freed, a reader that keeps trusting past a
	// writer's grant (controls of the multi scenarios, package doc).
	TrustIgnoreDone Trust = "ignore-done"
)

// Config configures a worker.
type Config struct {
	// Proc is the process id in the history, unique per incarnation.
	Proc string
	// Lockd lists the lockd gRPC addresses. With more than one the SDK
	// connects to the first that answers, in the given order, and moves to
	// another when its replica dies, drains or stalls (client.New with a
	// comma-separated list, C2 #ct2-failover).
	Lockd []string
	// FencedURL is the fenced resource's base URL.
	FencedURL string
	// HistoryPath is the history file to create.
	HistoryPath string
	// Epoch is the run's epoch (package history).
	Epoch time.Time
	// Keys are the lock keys the worker picks from.
	Keys []string
	// SessionTTL is the TTL of the worker's sessions; 0 uses the server's.
	SessionTTL time.Duration
	// HoldMin and HoldMax bound the random time between the two writes of
	// a grant.
	HoldMin, HoldMax time.Duration
	// ClockScale is the rate of the SDK's clock relative to real time; 0
	// means 1 (the real clock).
	ClockScale float64
	// Trust is TrustSDK (default), or TrustReceiveTTL or TrustIgnoreDone
	// (controls).
	Trust Trust
	// Limit, if 2 or more, takes every key as a semaphore of Limit
	// (client.WithLimit); its writes are fenced.ModeSlot.
	Limit uint32
	// RW takes every key as a read/write lock: each grant is exclusive
	// with probability ExclusiveShare, else shared (client.Exclusive,
	// client.Shared); writes carry the grant's mode. Not with Limit.
	RW bool
	// HeartbeatInterval overrides the server's advertised interval; 0 keeps
	// it.
	HeartbeatInterval time.Duration
	// Pairs takes Keys[0] and, holding it, Keys[1] (pairs.go): workers
	// given the two in opposite orders close cycles of waits. Plain locks
	// only; exactly two keys.
	Pairs bool
	// Seed seeds the worker's random choices.
	Seed uint64
	// HoldAck, if set, is read after every hold line and its hold, before
	// the grant's second write: the worker waits for one line (or the end
	// of input). The harness answers a hold line only after any pause it
	// makes of it has stopped the process, so a pause cannot race the
	// second write (check.PausesHitHolders).
	HoldAck *bufio.Reader
}

// ExclusiveShare is the share of a read/write worker's grants that are
// exclusive.
const ExclusiveShare = 0.4

// Timeouts of the calls a worker makes outside the run's context, so that
// a stopping worker still finishes the grant it holds.
const (
	writeTimeout   = 5 * time.Second
	releaseTimeout = 5 * time.Second
	retryPause     = 50 * time.Millisecond
)

func (cfg *Config) validate() error {
	var errs []error
	if cfg.Proc == "" {
		errs = append(errs, errors.New("proc is required"))
	}
	if len(cfg.Lockd) == 0 {
		errs = append(errs, errors.New("at least one lockd address is required"))
	}
	if cfg.FencedURL == "" || cfg.HistoryPath == "" {
		errs = append(errs, errors.New("fenced url and history path are required"))
	}
	if len(cfg.Keys) == 0 {
		errs = append(errs, errors.New("at least one key is required"))
	}
	if cfg.HoldMin < 0 || cfg.HoldMax < cfg.HoldMin {
		errs = append(errs, fmt.Errorf("hold bounds %v..%v: want 0 <= min <= max", cfg.HoldMin, cfg.HoldMax))
	}
	if cfg.ClockScale < 0 {
		errs = append(errs, fmt.Errorf("clock scale %v is negative", cfg.ClockScale))
	}
	switch cfg.Trust {
	case "":
		cfg.Trust = TrustSDK
	case TrustSDK, TrustReceiveTTL, TrustIgnoreDone:
	default:
		errs = append(errs, fmt.Errorf("trust %q: want %s, %s or %s", cfg.Trust, TrustSDK, TrustReceiveTTL, TrustIgnoreDone))
	}
	if cfg.Pairs && (len(cfg.Keys) != 2 || cfg.RW || cfg.Limit > 1 || cfg.Trust != TrustSDK) {
		errs = append(errs, errors.New("pairs: exactly two keys, plain locks, trust sdk"))
	}
	if cfg.RW && cfg.Limit > 1 {
		errs = append(errs, fmt.Errorf("limit %d with rw: a key is a semaphore or a read/write lock", cfg.Limit))
	}
	if cfg.Epoch.IsZero() {
		errs = append(errs, errors.New("epoch is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: config: %w", err)
	}
	return nil
}

// worker is one running worker; only Run's goroutine uses its fields,
// except rec, out and the clock, which are safe for concurrent use.
type worker struct {
	cfg   Config
	rec   *history.Recorder
	out   io.Writer
	outMu sync.Mutex
	c     *client.Client
	fc    *fenced.Client
	rng   *rand.Rand
	clock *scaledClock // nil: the real clock

	sess    *client.Session
	sessTTL time.Duration
	// next is the key of the next acquire, picked before its session is
	// opened (the open is recorded as a want of it, history.Open) and kept
	// across failed opens; "" once the acquire is sent.
	next string
	// lastPeer is the address of the lockd replica the latest successful
	// unary call went to (peerRecorder): with pick-first, the replica the
	// worker talks to.
	lastPeer atomic.Value // string
}

// Run runs a worker until ctx ends, then finishes the grant it holds,
// closes its session and the history file. out receives the state lines
// (package doc).
func Run(ctx context.Context, cfg Config, out io.Writer) (err error) {
	if err := cfg.validate(); err != nil {
		return err
	}
	rec, err := history.Create(cfg.HistoryPath, cfg.Proc, history.NewClock(cfg.Epoch))
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() {
		if cerr := rec.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("worker: history: %w", cerr))
		}
	}()
	w := &worker{
		cfg: cfg,
		rec: rec,
		out: out,
		fc:  fenced.NewClient(cfg.FencedURL),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x636861)),
	}
	defer w.fc.Close()

	opts := []client.Option{client.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(w.peerRecorder))}
	if cfg.ClockScale != 0 && cfg.ClockScale != 1 {
		w.clock = newScaledClock(cfg.ClockScale)
		opts = append(opts, client.WithClock(w.clock))
	}
	if cfg.HeartbeatInterval > 0 {
		opts = append(opts, client.WithHeartbeatInterval(cfg.HeartbeatInterval))
	}
	// Several addresses: the SDK's failover (C2 #ct2-failover) moves
	// between them.
	w.c, err = client.New(strings.Join(cfg.Lockd, ","), opts...)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() {
		w.dropSession()
		if cerr := w.c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("worker: close client: %w", cerr))
		}
	}()

	for ctx.Err() == nil && rec.Err() == nil {
		if cfg.Pairs {
			w.pairIteration(ctx)
		} else {
			w.iteration(ctx)
		}
	}
	return rec.Err()
}

// peerRecorder is a unary client interceptor that remembers the remote
// address of every call that succeeded: the "hold" line names the replica
// the grant came through, which the replica-kill scenario SIGKILLs.
func (w *worker) peerRecorder(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if err == nil && p.Addr != nil {
		w.lastPeer.Store(p.Addr.String())
	}
	return err
}

// peer is the address lastPeer holds, "-" before the first call.
func (w *worker) peer() string {
	if a, ok := w.lastPeer.Load().(string); ok {
		return a
	}
	return "-"
}

// say writes one state line.
func (w *worker) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	w.outMu.Lock()
	defer w.outMu.Unlock()
	_, _ = io.WriteString(w.out, line)
}

// pause waits d, or less if ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (w *worker) dropSession() {
	if w.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = w.sess.Close(ctx) // best effort: an expired one is abandoned by the SDK anyway
	cancel()
	w.sess = nil
}

// session returns a live session, opening one if needed; nil when ctx
// ended or the server could not be reached for now. key is the key the
// worker acquires next: an open is recorded as an Open of it, so that a
// worker which cannot open a session after a fault still shows that it
// wants the key (check.Regrants).
func (w *worker) session(ctx context.Context, key string) *client.Session {
	if w.sess != nil && w.sess.Err() == nil {
		return w.sess
	}
	w.dropSession()
	var opts []client.SessionOption
	if w.cfg.SessionTTL > 0 {
		opts = append(opts, client.WithSessionTTL(w.cfg.SessionTTL))
	}
	call := w.rec.Invoke(history.Open, key, 0)
	s, err := w.c.NewSession(ctx, opts...)
	if err != nil {
		w.rec.Complete(call, history.Unknown, 0, err) // the server may have made a session nobody uses
		pause(ctx, retryPause)
		return nil
	}
	w.rec.Complete(call, history.OK, 0, nil)
	w.sess = s
	w.sessTTL = s.TTL()
	return w.sess
}

// realTime converts a time of the SDK's clock into real time.
func (w *worker) realTime(t time.Time) time.Time {
	if w.clock == nil {
		return t
	}
	return w.clock.real(t)
}

// iteration runs one acquire–write–hold–write–release round.
func (w *worker) iteration(ctx context.Context) {
	if w.next == "" {
		w.next = w.cfg.Keys[w.rng.IntN(len(w.cfg.Keys))]
	}
	key := w.next
	sess := w.session(ctx, key)
	if sess == nil {
		return // the next iteration tries again for the same key
	}
	w.next = ""
	mode, opts := w.grantMode()
	w.say("wait %s %s", key, sess.ID())
	call := w.rec.InvokeMode(history.Acquire, key, mode, 0)
	l, err := sess.Acquire(ctx, key, opts...)
	if err != nil {
		w.rec.Complete(call, acquireOutcome(err), 0, err)
		w.say("free %s", key)
		pause(ctx, retryPause)
		return
	}
	recv := time.Now()
	tok := l.Token()
	w.rec.Complete(call, history.OK, tok, nil)

	// The end of trust: the SDK's deadline (TrustSDK), or receive + TTL
	// (the control), unless the release comes first.
	var lost lostOnce
	watched := make(chan struct{})
	if w.cfg.Trust == TrustSDK {
		go func() { // exits when Done closes: Release below closes it at the latest
			defer close(watched)
			<-l.Done()
			if !errors.Is(l.Err(), client.ErrReleased) {
				lost.record(w.rec, key, tok, w.realTime(sess.Deadline()), "done closed: "+l.Err().Error())
			}
		}()
	} else {
		close(watched)
	}

	w.write(key, mode, tok)
	hold := w.cfg.HoldMin
	if d := w.cfg.HoldMax - w.cfg.HoldMin; d > 0 {
		hold += time.Duration(w.rng.Int64N(int64(d) + 1))
	}
	w.say("hold %s %d 1 %s %s", key, tok, cmp.Or(mode, "plain"), w.peer())
	time.Sleep(hold) // the critical section: not cut short by a stop, the grant is finished properly
	if w.cfg.HoldAck != nil {
		_, _ = w.cfg.HoldAck.ReadString('\n') // an error (EOF: the harness is gone) lets the worker go on
	}
	// trustEnd is when the worker's trust ends if nothing else ends it
	// first: the SDK's deadline, or receive + TTL under the control.
	trustEnd := func() time.Time { return w.realTime(sess.Deadline()) }
	switch w.cfg.Trust {
	case TrustReceiveTTL:
		end := recv.Add(w.sessTTL)
		trustEnd = func() time.Time { return end }
		if !time.Now().Before(end) {
			lost.record(w.rec, key, tok, end, "control: a full TTL since the grant arrived")
		}
	case TrustIgnoreDone:
		trustEnd = func() time.Time { return time.Now().Add(time.Hour) } // never before the release
	}
	w.write(key, mode, tok)

	// A deadline that passed before the release is the end of trust even if
	// the SDK's timer has not fired yet (Done may lag the deadline when the
	// process was stopped or starved of CPU).
	relAt := time.Now()
	if end := trustEnd(); end.Before(relAt) {
		lost.record(w.rec, key, tok, end, "deadline passed before the release (Done not closed yet)")
	}
	call = w.rec.Invoke(history.Release, key, tok)
	rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	err = l.Release(rctx)
	cancel()
	outcome := releaseOutcome(err)
	w.rec.Complete(call, outcome, 0, err)
	if outcome == history.Fail {
		// The release was refused: the grant is no longer this session's
		// current one, or will not be for long (its session died or lives
		// on another server), and the backend frees it on its own, no
		// earlier than the end of trust. Without this the history would
		// show the grant held forever.
		lost.record(w.rec, key, tok, relAt, "release refused: "+err.Error())
	}
	w.say("free %s", key)
	<-watched
}

// lostOnce records at most one lost op per grant: the watcher of Done and
// the release path may both see the end of trust.
type lostOnce struct {
	mu   sync.Mutex
	done bool
}

// record records that trust in (key, tok) ended at at (or now, if that is
// earlier), for the reason why: what Recorder.Lost does, with the reason in
// the op's text for whoever reads a violation.
func (o *lostOnce) record(rec *history.Recorder, key string, tok uint64, at time.Time, why string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	o.done = true
	now := rec.Clock().Now()
	rec.Record(history.Op{Kind: history.Lost, Key: key, Token: tok, Invoke: min(now, rec.Clock().At(at)),
		Complete: now, Outcome: history.OK, Err: why})
}

// grantMode picks the mode of the next grant (fenced.Mode*, empty for a
// plain lock) and the Acquire options that ask for it.
func (w *worker) grantMode() (string, []client.AcquireOption) {
	switch {
	case w.cfg.Limit > 1:
		return fenced.ModeSlot, []client.AcquireOption{client.WithLimit(w.cfg.Limit)}
	case w.cfg.RW && w.rng.Float64() < ExclusiveShare:
		return fenced.ModeExclusive, []client.AcquireOption{client.Exclusive()}
	case w.cfg.RW:
		return fenced.ModeShared, []client.AcquireOption{client.Shared()}
	}
	return fenced.ModePlain, nil
}

// write writes to the fenced resource with the grant's mode and token and
// records it.
func (w *worker) write(key, mode string, tok uint64) {
	call := w.rec.InvokeMode(history.Write, key, mode, tok)
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	_, err := w.fc.WriteMode(ctx, key, w.cfg.Proc, mode, tok)
	w.rec.Complete(call, fenced.OutcomeOf(err), 0, err)
}

// acquireOutcome classifies a failed Acquire. Only a request the server
// refused as malformed certainly had no effect: after any other error
// (cancelled wait, session ended, server gone) a grant may have been made.
func acquireOutcome(err error) history.Outcome {
	if errors.Is(err, client.ErrInvalidArgument) || errors.Is(err, client.ErrLimitMismatch) {
		return history.Fail
	}
	return history.Unknown
}

// releaseOutcome classifies Release's result: nil deleted the grant; a
// definite refusal (not the current grant; the SDK turns a not-owner after
// an ambiguous attempt into nil) deleted nothing; anything else may or may
// not have (a dead session after an ambiguous first attempt, a timeout).
func releaseOutcome(err error) history.Outcome {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, client.ErrNotOwner), errors.Is(err, client.ErrInvalidArgument):
		return history.Fail
	}
	return history.Unknown
}

// ParseList splits a comma-separated flag value, dropping empty items.
func ParseList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
