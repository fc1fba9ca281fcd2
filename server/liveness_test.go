package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server/internal/prefixstats"
	"lock.dev/lockd/store"
)

// counter returns the value of the metric name with the given labels.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestClientSilence: a client that stops heartbeating loses its session and
// locks to the server's silence closer, not before max(TTL, the Remaining
// last granted) after the server received its last request, and a waiter
// then gets the lock.
func TestClientSilence(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		logs := &lockdtest.Logs{}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Logger: logs.Logger()})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)

		opened := time.Now()
		silent := openRaw(t, ctx, api, 0).SessionId
		sent := time.Now()
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: silent, Key: "k"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire(silent, k) = %v, %v", g, err)
		}
		// The silent client trusted its lock until at most this instant.
		trustedUntil := sent.Add(time.Duration(g.RemainingMs) * time.Millisecond)

		waiter, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		l, err := waiter.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("waiter Acquire(k): %v", err)
		}
		granted := time.Now()
		// Neither the server nor the backend may free it earlier than the
		// TTL after the open or the Remaining granted with the lock.
		if granted.Before(trustedUntil) || granted.Sub(opened) < lockdtest.TTL {
			t.Errorf("waiter granted %v after the silent client's open, %v after its acquire; want >= TTL %v and >= remaining %dms",
				granted.Sub(opened), granted.Sub(sent), lockdtest.TTL, g.RemainingMs)
		}
		if slack := 5 * time.Second; granted.Sub(sent) > lockdtest.TTL+slack {
			t.Errorf("waiter granted %v after the silent client's last request; want within TTL + %v", granted.Sub(sent), slack)
		}
		if l.Token() <= g.Token {
			t.Errorf("waiter token %d; want > %d", l.Token(), g.Token)
		}
		// The loss is counted once: by the server's silence close
		// (client_silent) or, when the backend's own expiry (PostgreSQL's
		// reaper) ends the session first, by the backend (lease_expired) —
		// both run at the TTL, so either may win on a loaded machine.
		lostCount := func() (logged int, counted float64) {
			for _, reason := range []string{telemetry.LostClientSilent, telemetry.LostLeaseExpired} {
				logged += len(logs.Find(telemetry.EventSessionLost, map[string]string{"session": silent, "reason": reason}))
				counted += counter(t, srv.Registry, "lockd_sessions_lost_total", map[string]string{"reason": reason})
			}
			return logged, counted
		}
		testkit.Eventually(t, 10*time.Second, "the silent session's loss logged and counted", func() bool {
			logged, counted := lostCount()
			return logged >= 1 && counted >= 1
		})
		if logged, counted := lostCount(); logged != 1 || counted != 1 {
			t.Errorf("session_lost for the silent session logged %d times, lockd_sessions_lost_total{client_silent or lease_expired} = %v; want 1 and 1", logged, counted)
		}
		// The silent session is dead for good.
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: silent, RequestId: 1}); err != nil {
			t.Fatalf("KeepAlive send: %v", err)
		}
		if r, err := stream.Recv(); err != nil || r.Live {
			t.Errorf("heartbeat of the silent session after the close = %v, %v; want live=false", r, err)
		}
		// The heartbeating waiter was never closed.
		select {
		case <-waiter.Done():
			t.Errorf("waiter session ended: %v", waiter.Err())
		default:
		}
	})
}

// TestSilenceWaitsForGrantedRemaining: when the store grants a Remaining
// longer than the TTL, the server waits that long before closing a silent
// client (docs/safety.md, "What the server may and may not do": never before
// the last granted Remaining has run out).
func TestSilenceWaitsForGrantedRemaining(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		logs := &lockdtest.Logs{}
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Logger: logs.Logger(), NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		id := openRaw(t, ctx, api, 0).SessionId
		const granted = 2 * lockdtest.TTL
		faulty.SetRemaining(granted)
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		sent := time.Now()
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: 1}); err != nil {
			t.Fatalf("send: %v", err)
		}
		r, err := stream.Recv()
		if err != nil || !r.Live || r.RemainingMs != granted.Milliseconds() {
			t.Fatalf("heartbeat = %v, %v; want live with remaining %v", r, err, granted)
		}
		// The server is done with the session when it pushes live=false on
		// the stream. (On PostgreSQL the backend, which only promised the
		// TTL, freed the session earlier and counted it lost itself; the
		// server then ends its record without counting it again.)
		var closedAt time.Time
		for closedAt.IsZero() {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for the silent session's end: %v", err)
			}
			if !r.Live {
				closedAt = time.Now()
			}
		}
		if recs := logs.Find(telemetry.EventSessionLost, map[string]string{"session": id}); len(recs) != 1 {
			t.Errorf("session_lost logged %d times for the silent session; want 1", len(recs))
		}
		if closedAt.Sub(sent) < granted {
			t.Errorf("silent session closed %v after its last heartbeat was sent; want >= the granted %v", closedAt.Sub(sent), granted)
		}
	})
}

// TestRevokeNotifiesHolder: a revoke, made through this server or through
// another replica on the same backend, reaches the holder as a LockLost
// notice on its KeepAlive stream.
func TestRevokeNotifiesHolder(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		ns := lockdtest.NewNamespace(t, backend)
		srv := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true})
		replica := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		id := openRaw(t, ctx, api, longTTL).SessionId
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: 1}); err != nil {
			t.Fatalf("send: %v", err)
		}
		if r, err := stream.Recv(); err != nil || !r.Live {
			t.Fatalf("heartbeat = %v, %v; want live", r, err)
		}
		for i, via := range []lockdv1.LockServiceClient{api, dial(t, replica.Addr)} {
			key := []string{"here", "replica"}[i]
			g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: id, Key: key})
			if err != nil || !g.Granted {
				t.Fatalf("Acquire(%s) = %v, %v", key, g, err)
			}
			rv, err := via.Revoke(ctx, &lockdv1.RevokeRequest{Key: key})
			if err != nil || !rv.Revoked || rv.Token != g.Token || rv.SessionId != id {
				t.Fatalf("Revoke(%s) = %v, %v; want the grant (token %d)", key, rv, err, g.Token)
			}
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for the lock-lost notice: %v", err)
			}
			want := &lockdv1.LockLost{Key: key, Token: g.Token, Reason: lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED}
			if r.RequestId != 0 || r.SessionId != id || !r.Live || len(r.Lost) != 1 ||
				r.Lost[0].Key != want.Key || r.Lost[0].Token != want.Token || r.Lost[0].Reason != want.Reason {
				t.Errorf("notice after revoke via %s = %v; want request_id 0, live, lost [%v]", key, r, want)
			}
		}
		// Revoking a free key revokes nothing.
		if rv, err := api.Revoke(ctx, &lockdv1.RevokeRequest{Key: "free"}); err != nil || rv.Revoked {
			t.Errorf("Revoke(free) = %v, %v; want revoked=false", rv, err)
		}
	})
}

// TestCardinality runs 250 sessions × 3 keys through the server and
// checks the C4 cardinality budget (#ct4-cardinality): at most 200 series
// (every histogram bucket, _sum and _count counted) — fewer than the
// sessions, so a label per session cannot pass — and no label value that
// is a key or a session id. Sequential (forBackendsAlone): its 250
// sessions would crowd the timing of the package's other tests.
func TestCardinality(t *testing.T) {
	forBackendsAlone(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 480*time.Second)
		api := dial(t, srv.Addr)
		const sessions, keys, workers = 250, 3, 25
		ids := make(chan string, sessions)
		errs := make(chan error, workers)
		secret := map[string]bool{}
		for k := range keys {
			secret[keyName(k)] = true
		}
		for range workers {
			go func() {
				errs <- func() error {
					stream, err := api.KeepAlive(ctx)
					if err != nil {
						return err
					}
					defer stream.CloseSend()
					for range sessions / workers {
						// A long TTL: under load one session's work may
						// take longer than the test TTL, and expiry is not
						// the point here.
						resp, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: 120_000})
						if err != nil {
							return err
						}
						id := resp.SessionId
						ids <- id
						if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: 1}); err != nil {
							return err
						}
						if _, err := stream.Recv(); err != nil {
							return err
						}
						for k := range keys {
							g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: id, Key: keyName(k)})
							if err != nil {
								return err
							}
							if g.Granted {
								if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: id, Key: g.Key, Token: g.Token}); err != nil {
									return err
								}
							}
						}
						if _, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: id}); err != nil {
							return err
						}
					}
					return nil
				}()
			}()
		}
		for range workers {
			if err := <-errs; err != nil {
				t.Fatalf("workload: %v", err)
			}
		}
		close(ids)
		for id := range ids {
			secret[id] = true
		}
		fams, err := srv.Registry.Gather()
		if err != nil {
			t.Fatalf("Gather: %v", err)
		}
		series, expanded, templated := 0, 0, 0
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), "lockd_") {
				t.Errorf("registry holds %s, which is not a lockd metric", f.GetName())
			}
			for _, m := range f.GetMetric() {
				if templateStat(f.GetName()) {
					// Bounded on their own (C4 #ct4-template-stats).
					templated += seriesOf(f.GetType(), m)
				} else {
					series++
					expanded += seriesOf(f.GetType(), m)
				}
				for _, lp := range m.GetLabel() {
					if secret[lp.GetValue()] {
						t.Errorf("%s has label %s=%q, a key or session id", f.GetName(), lp.GetName(), lp.GetValue())
					}
				}
			}
		}
		t.Logf("%d label sets (%d series with histogram buckets expanded), %d per-template series", series, expanded, templated)
		if templated > prefixstats.MaxSeries || templated == 0 {
			t.Errorf("the per-template statistics hold %d series; want 1..%d (C4 #ct4-template-stats)", templated, prefixstats.MaxSeries)
		}
		if expanded > 200 {
			t.Errorf("registry holds %d series (%d label sets) after %d sessions × %d keys; want <= 200 (C4)", expanded, series, sessions, keys)
		}
		if got := counter(t, srv.Registry, "lockd_sessions_opened_total", nil); got != sessions {
			t.Errorf("lockd_sessions_opened_total = %v; want %d", got, sessions)
		}
	})
}

// templateStat reports whether a metric is a per-template statistic (C4
// #ct4-template-stats).
func templateStat(name string) bool {
	switch name {
	case "lockd_lock_wait_seconds", "lockd_lock_hold_seconds", "lockd_lock_queue_length":
		return true
	}
	return false
}

func keyName(k int) string { return "card/key-" + string(rune('a'+k)) }

func seriesOf(typ dto.MetricType, m *dto.Metric) int {
	if typ == dto.MetricType_HISTOGRAM {
		return len(m.GetHistogram().GetBucket()) + 3 // +Inf, _sum, _count
	}
	return 1
}

// TestShutdown: by default sessions are left to expire (their locks stay
// held after Shutdown); with close-sessions-on-shutdown they are closed and
// their clients told at once.
func TestShutdown(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		for _, closeAll := range []bool{false, true} {
			cfg := lockdtest.Config()
			cfg.CloseSessionsOnShutdown = closeAll
			srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg})
			ctx := testCtx(t, 60*time.Second)
			s, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
			if err != nil {
				t.Fatalf("NewSession: %v", err)
			}
			if _, err := s.Acquire(ctx, "k"); err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			metrics := httptest.NewServer(srv.MetricsHandler())
			t.Cleanup(metrics.Close)
			if code, body := get(t, metrics.URL+"/healthz"); code != http.StatusOK {
				t.Errorf("/healthz before shutdown = %d %q; want 200", code, body)
			}
			if code, body := get(t, metrics.URL+"/metrics"); code != http.StatusOK ||
				!strings.Contains(body, "lockd_sessions_active") || strings.Contains(body, "etcd_") {
				t.Errorf("/metrics = %d; want 200 with lockd metrics only:\n%s", code, body)
			}
			stopped := time.Now()
			if err := srv.Stop(); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if code, _ := get(t, metrics.URL+"/healthz"); code != http.StatusServiceUnavailable {
				t.Errorf("/healthz after shutdown = %d; want 503", code)
			}
			info, held, err := srv.Store.Inspect(ctx, "k")
			if err != nil {
				t.Fatalf("store Inspect: %v", err)
			}
			if held == closeAll {
				t.Errorf("close-sessions-on-shutdown=%v: key held after Shutdown = %v (%v); want %v", closeAll, held, info, !closeAll)
			}
			if closeAll {
				// Told on its stream: the session ends well before its deadline.
				select {
				case <-s.Done():
				case <-time.After(time.Until(s.Deadline())):
					t.Errorf("session still trusted at its deadline although the server closed it")
				}
				if took := time.Since(stopped); took > lockdtest.TTL {
					t.Errorf("session ended %v after shutdown; want promptly", took)
				}
			}
		}
	})
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestShutdownHeartbeatOverlappingClose (issue 21, C5
// #ct5-close-on-shutdown): a heartbeat whose store call is in flight when
// close-sessions-on-shutdown moves its session to Draining is answered like
// every heartbeat of a Draining session — UNAVAILABLE SHUTTING_DOWN with the
// pending notices — never "not live": a client told dead ends the session
// and never acknowledges the notice it was just sent (the Go SDK drops the
// acknowledgement it queued), so the server waited for the session's
// trust to run out (a minute) and Shutdown overran its 20 s (make stress,
// 2026-12-07). The store call is held by a barrier until the notice, pushed
// by the move, has arrived. On the old code the answer was live=false
// without error.
func TestShutdownHeartbeatOverlappingClose(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		cfg := lockdtest.Config()
		cfg.CloseSessionsOnShutdown = true
		var f *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { f = lockdtest.NewFaulty(st); return f }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		sess := openRaw(t, ctx, api, longTTL)
		if _, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sess.SessionId, Keys: []string{"k"}}); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		ka, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		inStore, release := make(chan struct{}), make(chan struct{})
		f.During(telemetry.OpHeartbeat, func() { close(inStore); <-release })
		if err := ka.Send(&lockdv1.KeepAliveRequest{SessionId: sess.SessionId, RequestId: 1}); err != nil {
			t.Fatal(err)
		}
		<-inStore
		stopped := make(chan error, 1)
		go func() { stopped <- srv.Stop() }() // exits when Stop returns (bounded by its 20 s)

		// The notice the move to Draining pushes: the session is Draining now.
		n, err := ka.Recv()
		if err != nil || n.RequestId != 0 || len(n.Lost) != 1 ||
			n.Lost[0].Reason != lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN {
			close(release)
			t.Fatalf("first message %v, %v; want the SERVER_SHUTDOWN notice pushed", n, err)
		}
		close(release)
		r, err := ka.Recv()
		if err != nil {
			t.Fatalf("answer to the heartbeat in flight: %v", err)
		}
		if r.RequestId != 1 || !r.Live || r.GetError().GetReason() != wireerr.ReasonShuttingDown ||
			len(r.Lost) != 1 || r.Lost[0].NoticeId != n.Lost[0].NoticeId {
			t.Errorf("answer to the heartbeat in flight when the shutdown began: %v; want SHUTTING_DOWN "+
				"carrying notice %d, never not live (the client would end the session unacknowledged)", r, n.Lost[0].NoticeId)
		}
		// The client acknowledges: the session is closed at once, the key
		// freed, and Shutdown returns well inside its bound.
		if err := ka.Send(&lockdv1.KeepAliveRequest{SessionId: sess.SessionId, RequestId: 2,
			Ack: []uint64{n.Lost[0].NoticeId}}); err != nil {
			t.Fatal(err)
		}
		if err := <-stopped; err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if info, held, err := srv.Store.Inspect(ctx, "k"); err != nil || held {
			t.Errorf("store Inspect(k) = %v, held %v, %v; want free once the notice was acknowledged", info, held, err)
		}
	})
}
