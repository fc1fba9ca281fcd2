package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestNewChecksTiming: New rejects a safety margin or heartbeat interval the
// server's rules (C5 lock.client.*) reject for a known TTL, with
// ErrInvalidArgument and a message naming the setting, and accepts the
// boundary values.
func TestNewChecksTiming(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name         string
		ttl, margin  time.Duration
		interval     time.Duration
		wantInErrMsg string // "" means New succeeds
	}{
		{name: "defaults"},
		{name: "margin just below ttl/2", ttl: 4 * s, margin: 2*s - time.Millisecond},
		{name: "margin ttl/2", ttl: 4 * s, margin: 2 * s, wantInErrMsg: "safety margin 2s must be > 0 and < ttl/2"},
		{name: "margin above ttl", ttl: 2 * s, margin: 3 * s, wantInErrMsg: "safety margin 3s"},
		{name: "negative margin", margin: -s, wantInErrMsg: "negative safety margin"},
		{name: "negative interval", interval: -s, wantInErrMsg: "negative"},
		{name: "negative ttl", ttl: -s, wantInErrMsg: "negative"},
		{name: "interval below minimum", interval: 50 * time.Millisecond, wantInErrMsg: "below the minimum 100ms"},
		{name: "interval at minimum", interval: 100 * time.Millisecond},
		{name: "interval ttl-2margin", ttl: 6 * s, margin: s, interval: 4 * s},
		{name: "interval above ttl-2margin", ttl: 6 * s, margin: s, interval: 4*s + time.Millisecond,
			wantInErrMsg: "heartbeat interval 4.001s must be at most ttl − 2×safety margin = 4s"},
		{name: "interval ttl, margin from server", ttl: 6 * s, interval: 6 * s,
			wantInErrMsg: "heartbeat interval 6s must be below the ttl 6s"},
		{name: "interval without ttl", interval: time.Hour},
		{name: "margin without ttl", margin: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New("127.0.0.1:1", client.WithTTL(tc.ttl), client.WithSafetyMargin(tc.margin),
				client.WithHeartbeatInterval(tc.interval))
			if tc.wantInErrMsg == "" {
				if err != nil {
					t.Fatalf("New(ttl %v, margin %v, interval %v): %v; want no error", tc.ttl, tc.margin, tc.interval, err)
				}
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				return
			}
			if err == nil {
				_ = c.Close()
				t.Fatalf("New(ttl %v, margin %v, interval %v) succeeded; want an error containing %q",
					tc.ttl, tc.margin, tc.interval, tc.wantInErrMsg)
			}
			if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantInErrMsg) {
				t.Errorf("New(ttl %v, margin %v, interval %v) = %v; want ErrInvalidArgument containing %q",
					tc.ttl, tc.margin, tc.interval, err, tc.wantInErrMsg)
			}
		})
	}
}

// TestNewSessionChecksTiming: settings New cannot check (the TTL comes per
// session or from the server) are checked by NewSession, with
// ErrInvalidArgument, and leave no session behind; good ones work. The
// server runs lockdtest.TTL (3s) and lockdtest.SafetyMargin (500ms).
func TestNewSessionChecksTiming(t *testing.T) {
	srv := lockdtest.StartBackend(t, "etcd", lockdtest.Options{NoClient: true})
	ctx := testCtx(t, 30*time.Second)
	const s = time.Second
	for _, tc := range []struct {
		name         string
		opts         []client.Option
		sessTTL      time.Duration
		wantInErrMsg string
	}{
		{name: "server's settings"},
		{name: "margin vs server ttl", opts: []client.Option{client.WithSafetyMargin(1500 * time.Millisecond)},
			wantInErrMsg: "safety margin 1.5s must be > 0 and < ttl/2 (ttl 3s)"},
		{name: "margin vs session ttl", opts: []client.Option{client.WithSafetyMargin(2 * s)},
			sessTTL: 4 * s, wantInErrMsg: "safety margin 2s must be > 0 and < ttl/2 (ttl 4s)"},
		{name: "margin fits session ttl", opts: []client.Option{client.WithSafetyMargin(2 * s)}, sessTTL: 5 * s},
		{name: "interval vs server ttl and margin", opts: []client.Option{client.WithHeartbeatInterval(2500 * time.Millisecond)},
			wantInErrMsg: "heartbeat interval 2.5s must be at most ttl − 2×safety margin = 2s"},
		{name: "interval at the bound", opts: []client.Option{client.WithHeartbeatInterval(2 * s)}},
		{name: "interval vs session ttl", opts: []client.Option{client.WithHeartbeatInterval(3 * s),
			client.WithSafetyMargin(s)}, sessTTL: 4 * s,
			wantInErrMsg: "heartbeat interval 3s must be at most ttl − 2×safety margin = 2s"},
		{name: "interval vs session ttl, server margin", opts: []client.Option{client.WithHeartbeatInterval(5 * s)},
			sessTTL: 5 * s, wantInErrMsg: "heartbeat interval 5s must be below the ttl 5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := srv.NewClient(t, tc.opts...)
			var sopts []client.SessionOption
			if tc.sessTTL > 0 {
				sopts = append(sopts, client.WithSessionTTL(tc.sessTTL))
			}
			sess, err := c.NewSession(ctx, sopts...)
			if tc.wantInErrMsg == "" {
				if err != nil {
					t.Fatalf("NewSession: %v; want a session", err)
				}
				if err := sess.Close(ctx); err != nil {
					t.Errorf("Close: %v", err)
				}
				return
			}
			if err == nil {
				_ = sess.Close(ctx)
				t.Fatalf("NewSession succeeded; want an error containing %q", tc.wantInErrMsg)
			}
			if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantInErrMsg) {
				t.Errorf("NewSession = %v; want ErrInvalidArgument containing %q", err, tc.wantInErrMsg)
			}
		})
	}
}
