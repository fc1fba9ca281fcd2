package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/pgtest"
)

// acquireToken takes key through the SDK on the server at addr, releases it
// and returns its fencing token.
func acquireToken(t *testing.T, addr, key string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(addr)
	if err != nil {
		t.Fatalf("client.New(%s): %v", addr, err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer s.Close(ctx)
	l, err := s.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return l.Token()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestServeEmbedded starts `lockd serve` with no config file on a fresh data
// dir, checks its line, /metrics and /healthz, and restarts it on the same
// dir: fencing tokens keep rising.
func TestServeEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}

	srv := start(t, nil, args...)
	addr, metricsAddr, backend := srv.serving(t)
	if backend != "embedded" {
		t.Errorf("serve line says backend=%s, want embedded", backend)
	}
	var last uint64
	for range 3 {
		tok := acquireToken(t, addr, "serve/k")
		if tok <= last {
			t.Fatalf("token %d after %d: not increasing", tok, last)
		}
		last = tok
	}

	code, body := httpGet(t, "http://"+metricsAddr+"/healthz")
	if code != http.StatusOK {
		t.Errorf("/healthz = %d %q, want 200", code, body)
	}
	code, body = httpGet(t, "http://"+metricsAddr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`lockd_sessions_opened_total{backend="etcd"} 3`,
		`lockd_lock_acquire_total{backend="etcd",result="granted"} 3`,
		`lockd_lock_release_total{backend="etcd",reason="release"} 3`,
	} {
		if !strings.Contains(body, want) {
			name, _, _ := strings.Cut(want, "{")
			var have []string
			for line := range strings.SplitSeq(body, "\n") {
				if strings.HasPrefix(line, name) {
					have = append(have, line)
				}
			}
			t.Errorf("/metrics lacks %q; has %q", want, have)
		}
	}
	// Only C4 metrics, never a key or session label; nothing from etcd's
	// global registry. A template label (C4 #ct4-template-stats) names a
	// bounded class of keys, never a key: a declared template, the default
	// "first-segment/*", or "other".
	labels := regexp.MustCompile(`(\w+)="([^"]*)"`)
	for line := range strings.SplitSeq(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "lockd_") {
			t.Errorf("/metrics has a non-lockd series: %s", line)
		}
		for _, m := range labels.FindAllStringSubmatch(line, -1) {
			switch m[1] {
			case "backend", "reason", "result", "op", "kind", "batch", "le":
			case "template":
				if v := m[2]; v != "other" && (!strings.HasSuffix(v, "/*") || strings.Count(v, "/") != 1) {
					t.Errorf("/metrics series has template %q, neither \"other\" nor a first segment's \"x/*\": %s", v, line)
				}
			default:
				t.Errorf("/metrics series has label %q: %s", m[1], line)
			}
		}
	}

	if res := srv.stop(t, 60*time.Second); res.code != 0 {
		t.Fatalf("lockd serve after cancel: %v", res)
	}
	// C4 #ct4-log-delivery: every line logged before serve returned is
	// written by then, each a whole JSON line.
	for _, ev := range []string{"session_opened", "lock_acquired", "lock_released", "session_closed"} {
		if n := len(srv.stderr.Events(ev)); n != 3 {
			t.Errorf("stderr after serve returned has %d %s lines, want 3:\n%s", n, ev, srv.stderr)
		}
	}

	srv = start(t, nil, args...)
	addr, _, _ = srv.serving(t)
	if tok := acquireToken(t, addr, "serve/k"); tok <= last {
		t.Errorf("after restart on the same data dir: token %d, want > %d", tok, last)
	}
	if res := srv.stop(t, 60*time.Second); res.code != 0 {
		t.Fatalf("lockd serve after cancel: %v", res)
	}
}

// TestServeMetricsOff: --metrics-listen off prints metrics=off.
func TestServeMetricsOffPG(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	srv := start(t, []string{"LOCKD_BACKEND=pg", "LOCKD_PG_DSN=" + dsn},
		"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off")
	addr, metricsAddr, backend := srv.serving(t)
	if metricsAddr != "off" || backend != "pg" {
		t.Errorf("serve line: metrics=%s backend=%s, want off and pg", metricsAddr, backend)
	}
	a, b := acquireToken(t, addr, "k"), acquireToken(t, addr, "k")
	if b <= a {
		t.Errorf("tokens %d then %d: not increasing", a, b)
	}
	if res := srv.stop(t, 60*time.Second); res.code != 0 {
		t.Fatalf("lockd serve after cancel: %v", res)
	}
}

// TestServeListenTaken: a busy gRPC address is an error naming the key, and
// the embedded etcd started before it is stopped again.
func TestServeListenTaken(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	res := lockd(t, nil, "serve", "--data-dir", t.TempDir(), "--listen", lis.Addr().String(), "--metrics-listen", "off")
	if res.code != ExitError || !strings.Contains(res.stderr, "lock.server.listen: listen tcp "+lis.Addr().String()) {
		t.Errorf("serve on a busy address: %v", res)
	}
}

func TestServeConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ []string
		args    []string
		code    int
		want    []string
	}{
		{"ttl out of bounds", nil, []string{"--session-ttl", "1s"}, ExitError, []string{"lock.session.ttl (flag --session-ttl)"}},
		{"unknown env", []string{"LOCKD_SESION_TTL=15s"}, nil, ExitError, []string{`"LOCKD_SESION_TTL" (env): unknown configuration key`}},
		{"bad env duration", []string{"LOCKD_SESSION_TTL=15"}, nil, ExitError, []string{"lock.session.ttl (env LOCKD_SESSION_TTL)"}},
		{"missing config file", nil, []string{"--config", "/nonexistent/lockd.yaml"}, ExitError, []string{"/nonexistent/lockd.yaml"}},
		{"unknown flag", nil, []string{"--sesion-ttl", "15s"}, ExitUsage, []string{"unknown flag: --sesion-ttl"}},
		{"argument", nil, []string{"extra"}, ExitUsage, []string{"want no arguments"}},
		{"pg unreachable", nil, []string{"--backend", "pg", "--pg-dsn", "postgres://127.0.0.1:1/x", "--pg-schema", "x"},
			ExitError, []string{"lock.pg.dsn"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := lockd(t, tt.environ, append([]string{"serve"}, tt.args...)...)
			if res.code != tt.code {
				t.Errorf("exit %d, want %d\n%v", res.code, tt.code, res)
			}
			for _, w := range tt.want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr lacks %q\n%v", w, res)
				}
			}
			if res.stdout != "" {
				t.Errorf("stdout = %q, want nothing", res.stdout)
			}
		})
	}
}
