package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

// DefaultServer is the server address client commands use without --server
// or $LOCKD_SERVER.
const DefaultServer = "127.0.0.1:7420"

// EnvServer names the environment variable with the server address.
const EnvServer = "LOCKD_SERVER"

// Environment variables of the client commands' TLS flags (reserved in C5
// #ct5-tls: lockd serve ignores them).
const (
	EnvTLSCA         = "LOCKD_TLS_CA"
	EnvTLSCert       = "LOCKD_TLS_CERT"
	EnvTLSKey        = "LOCKD_TLS_KEY"
	EnvTLSServerName = "LOCKD_TLS_SERVER_NAME"
	// EnvTokenFile names the file holding the bearer token (C5 #ct5-auth);
	// there is deliberately no variable or flag taking the token itself.
	EnvTokenFile = "LOCKD_TOKEN_FILE"
)

// clientFlags are the flags every client command has.
type clientFlags struct {
	server  string
	timeout time.Duration
	// TLS: any of them set turns TLS on.
	tlsCA, tlsCert, tlsKey, tlsServerName string
	// tokenFile holds the bearer token sent with every call.
	tokenFile string
}

func addClientFlags(cmd *cobra.Command, e *env) *clientFlags {
	f := &clientFlags{}
	def := e.getenv(EnvServer)
	if def == "" {
		def = DefaultServer
	}
	cmd.Flags().StringVar(&f.server, "server", def, "lockd server address (host:port); several replicas of one backend as a,b,c (host:port each) or a DNS name "+
		"(dns:///name:port): the client uses one and moves to another when it dies or drains [$"+EnvServer+"]")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second,
		"how long to keep trying to reach the server before giving up")
	cmd.Flags().StringVar(&f.tlsCA, "tls-ca", e.getenv(EnvTLSCA),
		"PEM CA bundle to verify the server with (turns TLS on; default: the system roots) [$"+EnvTLSCA+"]")
	cmd.Flags().StringVar(&f.tlsCert, "tls-cert", e.getenv(EnvTLSCert),
		"PEM client certificate for mutual TLS (with --tls-key) [$"+EnvTLSCert+"]")
	cmd.Flags().StringVar(&f.tlsKey, "tls-key", e.getenv(EnvTLSKey), "PEM private key of --tls-cert [$"+EnvTLSKey+"]")
	cmd.Flags().StringVar(&f.tlsServerName, "tls-server-name", e.getenv(EnvTLSServerName),
		"name to verify in the server's certificate (default: the host of --server) [$"+EnvTLSServerName+"]")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", e.getenv(EnvTokenFile),
		"file holding the bearer token to authenticate with (sent over TLS, or in plaintext to a loopback server only) [$"+EnvTokenFile+"]")
	return f
}

// tlsOption returns the SDK option for the --tls-* flags: TLS when any is
// set, nil (plaintext, loopback servers only) otherwise.
func (f *clientFlags) tlsOption() (client.Option, error) {
	if f.tlsCA == "" && f.tlsCert == "" && f.tlsKey == "" && f.tlsServerName == "" {
		return nil, nil
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, usageErrorf("--tls-cert and --tls-key go together")
	}
	cfg, err := client.TLSConfigFromFiles(f.tlsCA, f.tlsCert, f.tlsKey, f.tlsServerName)
	if err != nil {
		return nil, err
	}
	return client.WithTLS(cfg), nil
}

// dial returns a client of the server. It does not connect yet: the SDK
// retries until the context of each call ends, which --timeout bounds.
func (f *clientFlags) dial() (*client.Client, error) {
	if f.timeout <= 0 {
		return nil, usageErrorf("--timeout must be positive")
	}
	var opts []client.Option
	tlsOpt, err := f.tlsOption()
	if err != nil {
		return nil, err
	}
	if tlsOpt != nil {
		opts = append(opts, tlsOpt)
	}
	if f.tokenFile != "" {
		opts = append(opts, client.WithBearerTokenFile(f.tokenFile))
	}
	c, err := client.New(f.server, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", f.server, err)
	}
	return c, nil
}

// call runs fn under --timeout and explains an unreachable server.
func (f *clientFlags) call(ctx context.Context, fn func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	err := fn(cctx)
	return f.explain(ctx, err)
}

// explain rewords errors caused by an unreachable server.
func (f *clientFlags) explain(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	if errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("lockd server at %s unavailable (gave up after --timeout %v): %w", f.server, f.timeout, err)
	}
	return err
}

// outputFlag is --output text|json.
type outputFlag struct{ format string }

func addOutputFlag(cmd *cobra.Command) *outputFlag {
	o := &outputFlag{}
	cmd.Flags().StringVarP(&o.format, "output", "o", "text", "output format: text or json")
	return o
}

func (o *outputFlag) check() error {
	if o.format != "text" && o.format != "json" {
		return usageErrorf("--output must be text or json, not %q", o.format)
	}
	return nil
}

func (o *outputFlag) json() bool { return o.format == "json" }

// lockJSON is the JSON form of a key's state (inspect, ls).
type lockJSON struct {
	Key        string     `json:"key"`
	Held       bool       `json:"held"`
	Token      uint64     `json:"token,omitempty"`
	Session    string     `json:"session,omitempty"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
	HeldForMs  int64      `json:"held_for_ms,omitempty"`
	Waiters    []string   `json:"waiters"`
	// Owner, Labels and Value: the holder's (C2 #ct2-holder); the value
	// is base64, as encoding/json writes bytes.
	Owner  string            `json:"owner,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Value  []byte            `json:"value,omitempty"`
	// Kind, Limit and Holders describe a semaphore or read/write key
	// (C2 #ct2-multi): kind "semaphore" or "rw", the semaphore's N (1 for
	// a read/write lock), every holder in token order. The single-holder
	// fields above then describe the holder with the lowest token. All
	// three are absent for a plain lock.
	Kind    string       `json:"kind,omitempty"`
	Limit   uint32       `json:"limit,omitempty"`
	Holders []holderJSON `json:"holders,omitempty"`
	// LockDelayMs is the held grant's lock-delay; DelayRemainingMs, for a
	// free key, how long a lock-delay still keeps it (C2 #ct2-delay).
	LockDelayMs      int64 `json:"lock_delay_ms,omitempty"`
	DelayRemainingMs int64 `json:"delay_remaining_ms,omitempty"`
	// WaitEstimates (inspect only) are the waiters' wait estimates, in
	// queue order; absent when the server has none (C2
	// #ct2-wait-estimate).
	WaitEstimates []waitJSON `json:"wait_estimates,omitempty"`
}

// waitJSON is one waiter's wait estimate.
type waitJSON struct {
	Session    string `json:"session"`
	Position   int    `json:"position"`
	EstimateMs int64  `json:"estimate_ms"`
}

// holderJSON is one holder of a semaphore or read/write key.
type holderJSON struct {
	Token      uint64            `json:"token"`
	Session    string            `json:"session"`
	Mode       string            `json:"mode,omitempty"` // shared or exclusive; absent for a semaphore slot
	AcquiredAt *time.Time        `json:"acquired_at,omitempty"`
	HeldForMs  int64             `json:"held_for_ms,omitempty"`
	Owner      string            `json:"owner,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Value      []byte            `json:"value,omitempty"`
}

// multiKind names the kind of a key with several holders: "semaphore",
// "rw" (a read/write lock: its holders have a mode), or "" for a plain lock.
func multiKind(info client.LockInfo) string {
	switch {
	case len(info.Holders) == 0:
		return ""
	case info.Holders[0].Mode != "":
		return "rw"
	}
	return "semaphore"
}

// holderHeldFor is how long a holder of a multi-holder key has held it
// (display only, as heldFor).
func holderHeldFor(h client.HolderInfo, now time.Time) time.Duration {
	if h.AcquiredAt.IsZero() {
		return 0
	}
	return max(now.Sub(h.AcquiredAt), 0)
}

func toJSON(info client.LockInfo, now time.Time) lockJSON {
	j := lockJSON{Key: info.Key, Held: info.Held, Token: info.Token, Session: info.Session, Waiters: info.Waiters,
		Owner: info.Owner, Labels: info.Labels, Value: info.Value,
		LockDelayMs: info.LockDelay.Milliseconds(), DelayRemainingMs: info.DelayRemaining.Milliseconds()}
	if j.Waiters == nil {
		j.Waiters = []string{}
	}
	if info.Held && !info.AcquiredAt.IsZero() {
		at := info.AcquiredAt.UTC()
		j.AcquiredAt = &at
		j.HeldForMs = heldFor(info, now).Milliseconds()
	}
	for _, e := range info.WaitEstimates {
		j.WaitEstimates = append(j.WaitEstimates, waitJSON{e.Session, e.Position, e.Wait.Milliseconds()})
	}
	if j.Kind = multiKind(info); j.Kind != "" {
		j.Limit = info.Limit
		for _, h := range info.Holders {
			hj := holderJSON{Token: h.Token, Session: h.Session, Mode: h.Mode, Owner: h.Owner, Labels: h.Labels, Value: h.Value}
			if !h.AcquiredAt.IsZero() {
				at := h.AcquiredAt.UTC()
				hj.AcquiredAt = &at
				hj.HeldForMs = holderHeldFor(h, now).Milliseconds()
			}
			j.Holders = append(j.Holders, hj)
		}
	}
	return j
}

// heldFor is how long the key has been held, for display only: it compares
// the backend's clock with ours.
func heldFor(info client.LockInfo, now time.Time) time.Duration {
	if !info.Held || info.AcquiredAt.IsZero() {
		return 0
	}
	return max(now.Sub(info.AcquiredAt), 0)
}

// formatHeld renders a held-for duration for people: whole seconds above a
// minute, tenths below.
func formatHeld(d time.Duration) string {
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}
