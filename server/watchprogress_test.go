package server_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// progressEvery is the heartbeat interval, hence the Watch progress
// interval (C2 #ct2-watch-progress), of the servers of these tests.
const progressEvery = 200 * time.Millisecond

// progressConfig is lockdtest.Config with heartbeats (and Watch progress)
// every progressEvery.
func progressConfig() *lockdtest.Options {
	cfg := lockdtest.Config()
	cfg.HeartbeatInterval = progressEvery
	return &lockdtest.Options{Config: &cfg}
}

const progressKind = lockdv1.EventKind_EVENT_KIND_PROGRESS

// openWatch opens a raw Watch and returns it with its start cursor (the
// header lockd-watch-cursor); the stream ends with the test.
func openWatch(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, req *lockdv1.WatchRequest) (lockdv1.LockService_WatchClient, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	w, err := api.Watch(ctx, req)
	if err != nil {
		t.Fatalf("Watch(%v): %v", req, err)
	}
	md, err := w.Header()
	if err != nil || md == nil {
		_, err = w.Recv()
		t.Fatalf("Watch(%v): no header: %v", req, err)
	}
	start := md.Get("lockd-watch-cursor")
	if len(start) != 1 {
		t.Fatalf("Watch(%v): header lockd-watch-cursor = %q; want one cursor", req, start)
	}
	return w, start[0]
}

// maxProgressBefore bounds the progress messages a test takes while it
// waits for an event: 30 s of them at progressEvery.
const maxProgressBefore = int(30 * time.Second / progressEvery)

// recv returns the stream's next message.
func recv(t *testing.T, w lockdv1.LockService_WatchClient) *lockdv1.WatchResponse {
	t.Helper()
	r, err := w.Recv()
	if err != nil {
		t.Fatalf("Watch Recv: %v", err)
	}
	return r
}

// wantProgress fails unless r is a progress at cursor with the interval.
func wantProgress(t *testing.T, what string, r *lockdv1.WatchResponse, cursor string) {
	t.Helper()
	if r.Kind != progressKind || r.Cursor != cursor || r.ProgressIntervalMs != progressEvery.Milliseconds() ||
		r.Key != "" || r.SessionId != "" || r.Token != 0 {
		t.Fatalf("%s: got %v; want only a progress at cursor %q, progress_interval_ms %d", what, r, cursor, progressEvery.Milliseconds())
	}
}

// TestWatchProgress: the progress messages of C2 #ct2-watch-progress on
// both backends. A watch with progress gets one at once at its start
// cursor, then one per interval of silence at the same cursor; after an
// event, at that event's cursor. A resumed watch's progress stays at the
// caller's resume_after until an event (here the resync) is sent. A watch
// without progress never gets one: its first message, after several
// intervals, is the event.
func TestWatchProgress(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, *progressConfig())
		api := dial(t, srv.Addr)
		ctx := testCtx(t, time.Minute)

		plain, _ := openWatch(t, ctx, api, &lockdv1.WatchRequest{Prefix: "wp/"})
		w, start := openWatch(t, ctx, api, &lockdv1.WatchRequest{Prefix: "wp/", Progress: true})
		wantProgress(t, "first message", recv(t, w), start)
		began := time.Now()
		for i := range 3 { // at least two intervals of silence
			wantProgress(t, fmt.Sprintf("progress %d of an idle stream", i+2), recv(t, w), start)
		}
		if took := time.Since(began); took < 2*progressEvery {
			t.Errorf("three progress messages after the first took %v; want at least two intervals (%v each)", took, progressEvery)
		}

		s, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		if _, err := s.Acquire(ctx, "wp/a"); err != nil {
			t.Fatalf("Acquire(wp/a): %v", err)
		}
		var ev *lockdv1.WatchResponse
		for ev = recv(t, w); ev.Kind == progressKind; ev = recv(t, w) {
			wantProgress(t, "progress before the event", ev, start)
		}
		if ev.Kind != lockdv1.EventKind_EVENT_KIND_ACQUIRED || ev.Key != "wp/a" || ev.Cursor == "" {
			t.Fatalf("event after the acquire: %v; want acquired wp/a with a cursor", ev)
		}
		wantProgress(t, "progress after the event", recv(t, w), ev.Cursor)
		if r := recv(t, plain); r.Kind != lockdv1.EventKind_EVENT_KIND_ACQUIRED || r.Key != "wp/a" {
			t.Fatalf("watch without progress: first message %v; want the acquired wp/a (no progress)", r)
		}

		resumed, _ := openWatch(t, ctx, api, &lockdv1.WatchRequest{Prefix: "wp/", Progress: true, ResumeAfter: "not a cursor"})
		wantProgress(t, "a resumed stream's first message", recv(t, resumed), "not a cursor")
		// Under load the resync can take longer than an interval: a
		// progress before it stays at the resume point.
		r := recv(t, resumed)
		for n := 1; r.Kind == progressKind; n, r = n+1, recv(t, resumed) {
			wantProgress(t, "progress before the resync", r, "not a cursor")
			if n > maxProgressBefore {
				t.Fatalf("resumed from a non-cursor: %d progress messages and no resync", n)
			}
		}
		if r.Kind != lockdv1.EventKind_EVENT_KIND_RESYNC || r.Cursor == "" {
			t.Fatalf("resumed from a non-cursor: message after its progress %v; want the resync", r)
		}
		wantProgress(t, "progress after the resync", recv(t, resumed), r.Cursor)
	})
}

// TestWatchProgressFiltered: a watch the access filter thins out (C5
// #ct5-auth) gets its progress on time while events it may not read flow
// faster than the interval, and their cursors never show in its progress
// (C2 #ct2-watch-progress): a dropped event is nothing sent.
func TestWatchProgressFiltered(t *testing.T) {
	az, _ := authFiles(t, filterPolicy, "root", "reader")
	opts := progressConfig()
	opts.Auth, opts.NoClient = az, true
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], *opts)
	api := dial(t, srv.Addr)
	ctx := testCtx(t, time.Minute)
	root, reader := as(ctx, "root"), as(ctx, "reader")
	sess := openRaw(t, root, api, longTTL)
	sid := sess.SessionId

	w, start := openWatch(t, reader, api, &lockdv1.WatchRequest{Prefix: "", Progress: true})
	wantProgress(t, "first message", recv(t, w), start)
	// Unreadable events, one every few milliseconds, until the reader has
	// had three more progress messages.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // ends when stop is closed
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			key := fmt.Sprintf("b/%d", i)
			r, err := api.Acquire(root, &lockdv1.AcquireRequest{SessionId: sid, SessionSecret: sess.SessionSecret, Key: key})
			if err != nil || !r.Granted {
				done <- fmt.Errorf("Acquire(%s) = %v, %v", key, r, err)
				return
			}
			if _, err := api.Release(root, &lockdv1.ReleaseRequest{SessionId: sid, SessionSecret: sess.SessionSecret, Key: key, Token: r.Token}); err != nil {
				done <- fmt.Errorf("Release(%s): %v", key, err)
				return
			}
		}
	}()
	for i := range 3 {
		wantProgress(t, fmt.Sprintf("progress %d while unreadable keys change", i+2), recv(t, w), start)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHTTPWatchProgress: GET /v1/watch?progress=true starts with a
// progress line carrying the start cursor an HTTP client cannot read from
// a header (C2 #ct2-http, #ct2-watch-progress); resuming from it on etcd
// gives the event missed meanwhile (PostgreSQL: a resync).
func TestHTTPWatchProgress(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := startHTTP(t, backend, *progressConfig())
		c := newJClient(t, "http://"+srv.HTTPAddr, nil)
		first := watchLines(t, c, "hp/&progress=true")
		p := nextEvent(t, first)
		cursor, _ := p["cursor"].(string)
		if p["kind"] != "EVENT_KIND_PROGRESS" || cursor == "" || p["progress_interval_ms"] != fmt.Sprint(progressEvery.Milliseconds()) {
			t.Fatalf("first line %v; want a progress with the start cursor and progress_interval_ms %q", p, fmt.Sprint(progressEvery.Milliseconds()))
		}
		s := c.open(time.Minute)
		c.ok("POST", "/v1/locks/hp/1:acquire", obj{"session_id": s.id, "session_secret": s.secret})
		resumed := watchLines(t, c, "hp/&progress=true&resume_after="+url.QueryEscape(cursor))
		if p := nextEvent(t, resumed); p["kind"] != "EVENT_KIND_PROGRESS" || p["cursor"] != cursor {
			t.Fatalf("resumed: first line %v; want a progress at the resume cursor", p)
		}
		// Then the acquire replayed from history (etcd) or the resync (pg).
		// Under load that can take longer than an interval: a progress
		// before it stays at the resume cursor, never past the event it has
		// not delivered ("second line … EVENT_KIND_PROGRESS", a server
		// stress iteration on etcd).
		want := map[string]string{"etcd": "EVENT_KIND_ACQUIRED", "pg": "EVENT_KIND_RESYNC"}[backend]
		got := nextEvent(t, resumed)
		for n := 1; got["kind"] == "EVENT_KIND_PROGRESS"; n, got = n+1, nextEvent(t, resumed) {
			if got["cursor"] != cursor || n > maxProgressBefore {
				t.Fatalf("resumed: progress %d %v before the %s; want at most %d, at the resume cursor %s", n, got, want, maxProgressBefore, cursor)
			}
		}
		if got["kind"] != want {
			t.Fatalf("resumed: line after the progress %v; want %s", got, want)
		}
	})
}
