package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/lockd/internal/telemetry"
)

// Config holds the lock.auth.* keys of lockd's C5 configuration
// (docs/contracts/C5.md #ct5-auth).
type Config struct {
	// PolicyFile is lock.auth.policy-file: the access policy. Empty: no
	// access rules, every call is allowed (RuleNoPolicy).
	PolicyFile string `koanf:"lock.auth.policy-file"`
	// TokensFile is lock.auth.tokens-file: bearer-token hashes and their
	// principals. Empty: bearer tokens are refused.
	TokensFile string `koanf:"lock.auth.tokens-file"`
}

// DefaultConfig returns the C5 defaults: no policy, no tokens.
func DefaultConfig() Config { return Config{} }

// Validate checks the cross-field rule: a tokens file needs a policy.
func (c Config) Validate() error {
	if c.TokensFile != "" && c.PolicyFile == "" {
		return errors.New("lock.auth.tokens-file: needs lock.auth.policy-file (without a policy every caller may do everything)")
	}
	return nil
}

// DefaultReloadInterval is how often an Authorizer looks for changed files.
const DefaultReloadInterval = time.Second

// Options are an Authorizer's dependencies. The zero value is valid.
type Options struct {
	// Logger receives the C4 events auth_reloaded and auth_reload_failed;
	// nil discards them.
	Logger *slog.Logger
	// ReloadInterval is how often the files are checked for changes: 0
	// means DefaultReloadInterval, negative never (Reload only).
	ReloadInterval time.Duration
}

// Authorizer resolves callers' principals and decides their calls against
// the current policy. The files are re-read when their content changes and
// on Reload (lockd serve calls it on SIGHUP); a version that fails to parse is refused and the
// previous one stays in force.
//
// A nil *Authorizer, or one without a policy file, allows everything
// (RuleNoPolicy) and refuses bearer tokens. Safe for concurrent use.
type Authorizer struct {
	cfg    Config
	log    *slog.Logger
	policy atomic.Pointer[Policy]
	tokens atomic.Pointer[Tokens]

	mu   sync.Mutex        // serialises reloads
	seen map[string][]byte // file → the content last parsed (good or bad)
	stop chan struct{}     // closed by Close
	done chan struct{}     // closed when the reload loop returned
	once sync.Once
}

// New reads the files of cfg (a malformed or unreadable file is an error
// naming its key, path, line and reason) and, when there is a policy file,
// starts the reload goroutine that Close stops.
func New(cfg Config, opts Options) (*Authorizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Authorizer{cfg: cfg, log: telemetry.OrDiscard(opts.Logger), seen: map[string][]byte{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.PolicyFile == "" {
		close(a.done)
		return a, nil
	}
	if err := a.load(true); err != nil {
		return nil, err
	}
	interval := opts.ReloadInterval
	if interval == 0 {
		interval = DefaultReloadInterval
	}
	go a.loop(interval) // exits when Close closes a.stop
	return a, nil
}

// loop reloads changed files every interval (never when interval < 0)
// until Close.
func (a *Authorizer) loop(interval time.Duration) {
	defer close(a.done)
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-a.stop:
			return
		case <-tick:
			_ = a.load(false)
		}
	}
}

// Close stops the reload goroutine and waits for it. Idempotent; a nil
// Authorizer is fine.
func (a *Authorizer) Close() error {
	if a == nil {
		return nil
	}
	a.once.Do(func() { close(a.stop) })
	<-a.done
	return nil
}

// Reload re-reads both files now, changed or not. It returns the first
// refusal; a refused file keeps its previous version in force.
func (a *Authorizer) Reload() error {
	if a == nil || a.cfg.PolicyFile == "" {
		return nil
	}
	return a.load(true)
}

// load reads the files; with force it parses them even when unchanged
// since they were last parsed. At first load (no policy yet) any error is
// returned without logging.
func (a *Authorizer) load(force bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := a.policy.Load() == nil
	err := a.loadFile(a.cfg.PolicyFile, telemetry.AuthKindPolicy, force, first, func(b []byte) (int, error) {
		p, err := ParsePolicy(b)
		if err != nil {
			return 0, err
		}
		a.policy.Store(p)
		for _, r := range p.UnsafeRules() {
			telemetry.AuthPolicyUnsafe(a.log, a.cfg.PolicyFile, r)
		}
		return len(p.rules), nil
	})
	if a.cfg.TokensFile != "" {
		terr := a.loadFile(a.cfg.TokensFile, telemetry.AuthKindTokens, force, first, func(b []byte) (int, error) {
			t, err := ParseTokens(b)
			if err != nil {
				return 0, err
			}
			a.tokens.Store(t)
			return t.Len(), nil
		})
		err = errors.Join(err, terr)
	}
	return err
}

func (a *Authorizer) loadFile(path, kind string, force, first bool, apply func([]byte) (int, error)) error {
	key := "lock.auth." + kind + "-file"
	b, err := readFile(path)
	if err != nil {
		if !first && (force || a.seen[path] != nil) {
			telemetry.AuthReloadFailed(a.log, path, kind, 0, err)
		}
		a.seen[path] = nil // logged once until the file is back
		return fmt.Errorf("%s %s: %w", key, path, err)
	}
	if !force && a.seen[path] != nil && bytes.Equal(a.seen[path], b) {
		return nil
	}
	a.seen[path] = b
	n, err := apply(b)
	if err != nil {
		line := 0
		if pe, ok := errors.AsType[*ParseError](err); ok {
			line = pe.Line
		}
		if !first {
			telemetry.AuthReloadFailed(a.log, path, kind, line, err)
		}
		return fmt.Errorf("%s %s: %w", key, path, err)
	}
	telemetry.AuthReloaded(a.log, path, kind, n)
	return nil
}

// readFile reads a file of at most MaxFileSize bytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	switch {
	case err != nil:
		return nil, err
	case len(b) > MaxFileSize:
		return nil, fmt.Errorf("file is larger than %d bytes", MaxFileSize)
	case b == nil:
		b = []byte{}
	}
	return b, nil
}

// Enabled reports whether a policy is in force (calls are checked).
func (a *Authorizer) Enabled() bool { return a != nil && a.policy.Load() != nil }

// Policy returns the policy in force; nil (allow everything) without one.
func (a *Authorizer) Policy() *Policy {
	if a == nil {
		return nil
	}
	return a.policy.Load()
}

// Identify resolves the principal of the gRPC call in ctx (C5 #ct5-auth):
// its verified client certificate, its bearer token, or Anonymous. A
// refused credential is an error matching ErrUnauthenticated; the principal
// returned with it (the certificate's, or Anonymous) is for the audit trail
// only.
func (a *Authorizer) Identify(ctx context.Context) (string, error) {
	var tok *Tokens
	if a != nil {
		tok = a.tokens.Load()
	}
	return identify(ctx, tok)
}

// Decide is Policy.Decide on the policy in force.
func (a *Authorizer) Decide(principal string, act Action, key string) (allowed bool, rule string) {
	return a.Policy().Decide(principal, act, key)
}

// Scope is Policy.Scope on the policy in force.
func (a *Authorizer) Scope(principal string, act Action, prefix string) (all, some bool, rule string) {
	return a.Policy().Scope(principal, act, prefix)
}
