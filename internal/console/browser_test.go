package console_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/server"
)

func TestMain(m *testing.M) { lockdtest.Main(m) }

// consolePolicy: admin reads and revokes, reader only reads, worker only
// takes locks (C5 #ct5-auth); anonymous callers can do nothing.
const consolePolicy = `rules:
  - name: ops
    principals: [admin]
    prefixes: ["*"]
    allow: [read, admin]
  - name: readers
    principals: [reader]
    prefixes: ["*"]
    allow: [read]
  - name: workers
    principals: [worker]
    prefixes: ["*"]
    allow: [lock]
`

// startConsole starts a lockd server over the embedded etcd with the HTTP
// API and the console on, the policy above and a fresh random bearer token
// per principal; its Client takes locks as worker.
func startConsole(t *testing.T) (*lockdtest.Server, map[string]string) {
	t.Helper()
	az, tokens := consoleAuth(t)
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: consoleConfig(""), Auth: az,
		ClientOptions: []client.Option{client.WithBearerToken(tokens["worker"])}})
	return srv, tokens
}

// consoleConfig is a server configuration with the HTTP API and the
// console on httpAddr ("": a free port).
func consoleConfig(httpAddr string) *server.Config {
	cfg := lockdtest.Config()
	cfg.HTTPListen = "127.0.0.1:0"
	if httpAddr != "" {
		cfg.HTTPListen = httpAddr
	}
	cfg.HTTPConsole = true
	return &cfg
}

// consoleAuth returns an Authorizer of the policy above with a fresh
// random bearer token per principal.
func consoleAuth(t *testing.T) (*auth.Authorizer, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	tokens := map[string]string{}
	var file strings.Builder
	for _, p := range []string{"admin", "reader", "worker"} {
		tokens[p] = rand.Text()
		fmt.Fprintf(&file, "%s %s\n", auth.HashToken(tokens[p]), p)
	}
	pf, tf := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(pf, []byte(consolePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tf, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Config{PolicyFile: pf, TokensFile: tf}, auth.Options{})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(func() { _ = az.Close() })
	return az, tokens
}

// newBrowser starts headless Chromium (the Debian package) and returns the
// context of its first tab; the cleanup closes it and waits for the process.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("headless Chromium is needed for the console test (Debian: apt-get install chromium; .ci/run installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1100))
	if os.Geteuid() == 0 {
		// Chromium refuses to start its sandbox as root; only this test's
		// throwaway browser, on pages of a test server, runs without it.
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser process
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser (no timeout on this first call)
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// tab opens a new tab in the browser of ctx. Each tab has its own
// sessionStorage, so its own token. Every JavaScript dialog of the tab is
// answered with accept, and its message sent on the returned channel.
func tab(t *testing.T, ctx context.Context, accept bool) (context.Context, <-chan string) {
	t.Helper()
	tctx, cancel := chromedp.NewContext(ctx)
	if err := chromedp.Do(tctx); err != nil {
		t.Fatalf("open tab: %v", err)
	}
	msgs := make(chan string, 16)
	opening := chromedp.Events(tctx, page.JavascriptDialogOpening)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when tctx is cancelled (cleanup)
		defer wg.Done()
		for ev, err := range opening {
			if err != nil {
				return
			}
			select {
			case msgs <- ev.Message:
			default:
			}
			wg.Add(1)
			go func() { // the dialog blocks the page until answered
				defer wg.Done()
				_, err := chromedp.Call(tctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept})
				if err != nil && tctx.Err() == nil {
					t.Errorf("answer dialog %q: %v", ev.Message, err)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return tctx, msgs
}

// run runs browser actions with a deadline.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(actx, steps...); err != nil {
		t.Fatalf("%s: %v\npage:\n%s", what, err, pageText(ctx))
	}
}

// waitFor polls a JavaScript condition in the page (on every DOM change and
// every 100 ms) until it is true.
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 25*time.Second)
	defer cancel()
	_, err := chromedp.Run(actx, chromedp.Poll[bool](cond, chromedp.WithPollingInterval(100*time.Millisecond),
		chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		t.Fatalf("waiting until %s: %v\npage:\n%s", what, err, pageText(ctx))
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(actx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func pageText(ctx context.Context) string {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(actx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// rowIs is a condition: the held-keys table has a row for key whose cells
// read exactly these texts (waiters: the cell's text).
func rowIs(key, owner, session, token, waiters string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#locks-body tr.lock')].some(tr =>
		tr.querySelector('td.key').textContent === %s && tr.querySelector('td.owner').textContent === %s &&
		tr.querySelector('td.session').textContent === %s && tr.querySelector('td.token').textContent === %s &&
		tr.querySelector('td.waiters').textContent === %s)`, js(key), js(owner), js(session), js(token), js(waiters))
}

func rowGone(key string) string {
	return fmt.Sprintf(`![...document.querySelectorAll('#locks-body td.key')].some(td => td.textContent === %s)`, js(key))
}

// eventShown is a condition: the event list has an event of kind for key
// with token.
func eventShown(kind, key, token string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#events li')].some(li => li.dataset.kind === %s &&
		li.querySelector('.key').textContent === %s && li.querySelector('.token').textContent === 'token ' + %s)`,
		js(kind), js(key), js(token))
}

// setToken types a token into the page and applies it.
func setToken(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	run(t, ctx, "set the token", chromedp.Clear(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("apply")))
	waitFor(t, ctx, "the watch is live", `document.getElementById('watch-state').textContent === 'live'`)
}

func tokenOf(l *client.Lock) string { return strconv.FormatUint(l.Token(), 10) }

// TestConsoleInBrowser drives the console in headless Chromium against a
// real lockd server with access rules: an anonymous page is refused and
// says so; an admin sees a lock taken with the SDK appear with its owner,
// session and token, waiters in order, the sessions, the events, and the
// row disappear on release; keys with markup are shown as text; a reader's
// Revoke (confirmed) is refused and shown; an admin's confirmed Revoke
// revokes (the SDK's Lock.Done fires); the hot-keys panel shows a key
// waited for and held, refuses the anonymous page and follows the prefix.
// It writes a screenshot into the
// test's artifact directory (go test -artifacts keeps it).
func TestConsoleInBrowser(t *testing.T) {
	srv, tokens := startConsole(t)
	ctx := testkit.Context(t, 2*time.Minute)
	url := "http://" + srv.HTTPAddr + "/console/"
	browser := newBrowser(t)
	admin, adminDialogs := tab(t, browser, true)

	// Anonymous: the page loads (it is public), its data calls are refused.
	run(t, admin, "open the console", chromedp.Navigate(url))
	waitFor(t, admin, "the anonymous refusal is shown",
		`document.getElementById('locks-error').textContent.startsWith('403 ACCESS_DENIED')`)
	waitFor(t, admin, "the anonymous hot-keys refusal is shown",
		`document.getElementById('hot-error').textContent.startsWith('403 ACCESS_DENIED')`)

	setToken(t, admin, tokens["admin"])
	waitFor(t, admin, "the admin's list loads", `document.getElementById('locks-error').hidden`)

	sess, err := srv.Client.NewSession(ctx, client.WithOwner("report-job", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = sess.Close(context.Background()) }()
	report, err := sess.TryAcquire(ctx, "jobs/report", client.WithValue([]byte("build 42")))
	if err != nil {
		t.Fatalf("TryAcquire(jobs/report): %v", err)
	}
	waitFor(t, admin, "the jobs/report row shows its holder and token",
		rowIs("jobs/report", "report-job", sess.ID(), tokenOf(report), ""))
	waitFor(t, admin, "the jobs/report row shows its value", `document.querySelector('#locks-body tr[data-key="jobs/report"] td.value').textContent === 'build 42'`)
	waitFor(t, admin, "the acquired event is shown", eventShown("acquired", "jobs/report", tokenOf(report)))
	waitFor(t, admin, "the acquired event names the owner", `[...document.querySelectorAll('#events li[data-kind="acquired"] .owner')].some(o => o.textContent === 'report-job')`)

	// Keys are text: markup in a key is shown literally, never parsed.
	const markup = `xss/<script>window.pwned=1</script><b>x</b>`
	xss, err := sess.TryAcquire(ctx, markup)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", markup, err)
	}
	waitFor(t, admin, "the markup key's row", rowIs(markup, "report-job", sess.ID(), tokenOf(xss), ""))
	waitFor(t, admin, "the markup key's event", eventShown("acquired", markup, tokenOf(xss)))
	const injected = `document.querySelectorAll('main b, main script').length`
	if n := eval[int](t, admin, injected); n != 0 {
		t.Errorf("%d elements made from a key's markup (want 0: keys are text)", n)
	}
	if pwned := eval[bool](t, admin, `window.pwned !== undefined`); pwned {
		t.Error("a key's script ran")
	}
	// Control: the same check sees the elements when the key is parsed as
	// HTML, as innerHTML would.
	if n := eval[int](t, admin, fmt.Sprintf(`(() => { const d = document.createElement('div'); d.innerHTML = %s;
		return d.querySelectorAll('b, script').length })()`, js(markup))); n != 2 {
		t.Errorf("control: parsing the key as HTML made %d elements, want 2 (the check would be blind)", n)
	}
	if err := xss.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", markup, err)
	}

	// Waiters, in order.
	var waits sync.WaitGroup
	waitCtx, stopWaits := context.WithCancel(ctx)
	defer func() {
		stopWaits()
		waits.Wait()
	}()
	queued := func(key string) *client.Session {
		w, err := srv.Client.NewSession(ctx, client.WithOwner("waiter", nil))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		waits.Add(1)
		go func() { // ends when stopWaits cancels the wait
			defer waits.Done()
			if l, err := w.Acquire(waitCtx, key); err == nil {
				_ = l.Release(context.Background())
			}
		}()
		return w
	}
	w1 := queued("jobs/report")
	waitFor(t, admin, "the first waiter is shown", rowIs("jobs/report", "report-job", sess.ID(), tokenOf(report), "1. "+w1.ID()))
	w2 := queued("jobs/report")
	waitFor(t, admin, "both waiters are shown in order",
		rowIs("jobs/report", "report-job", sess.ID(), tokenOf(report), "1. "+w1.ID()+"\n2. "+w2.ID()))

	// The waiters' wait estimates (C2 #ct2-wait-estimate), from Inspect:
	// once holds of eta/k ended (the server has holds of its template,
	// other under this policy, before; the absent estimate is
	// server.TestWaitEstimate's), one per waiter in their column.
	eta := func() *client.Lock {
		l, err := sess.Acquire(ctx, "eta/k")
		if err != nil {
			t.Fatalf("Acquire(eta/k): %v", err)
		}
		return l
	}
	etaL := eta()
	we := queued("eta/k")
	waitFor(t, admin, "eta/k's waiter is shown", fmt.Sprintf(`(() => {
		const tr = document.querySelector('#locks-body tr[data-key="eta/k"]');
		return tr !== null && tr.querySelector('td.waiters').textContent === %s })()`, js("1. "+we.ID())))
	if err := etaL.Release(ctx); err != nil { // the waiter takes it and releases: two holds ended
		t.Fatalf("Release(eta/k): %v", err)
	}
	waitFor(t, admin, "eta/k is free", `document.querySelector('#locks-body tr[data-key="eta/k"]') === null`)
	etaL = eta()
	we2 := queued("eta/k")
	waitFor(t, admin, "eta/k's waiter is shown with an estimate", fmt.Sprintf(`(() => {
		const tr = document.querySelector('#locks-body tr[data-key="eta/k"]');
		return tr !== null && tr.querySelector('td.waiters').textContent === %s &&
			/^1\. ≈ \d/.test(tr.querySelector('td.estimates').textContent) })()`, js("1. "+we2.ID())))
	stopWaits()
	waits.Wait()
	if err := etaL.Release(ctx); err != nil {
		t.Fatalf("Release(eta/k): %v", err)
	}

	// A semaphore: every holder, and the key's kind.
	s2, err := srv.Client.NewSession(ctx, client.WithOwner("slot-2", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = s2.Close(context.Background()) }()
	slot1, err := sess.TryAcquire(ctx, "pool/slots", client.WithLimit(3))
	if err != nil {
		t.Fatalf("TryAcquire(pool/slots): %v", err)
	}
	slot2, err := s2.TryAcquire(ctx, "pool/slots", client.WithLimit(3))
	if err != nil {
		t.Fatalf("TryAcquire(pool/slots): %v", err)
	}
	waitFor(t, admin, "both semaphore holders are shown", fmt.Sprintf(`(() => {
		const tr = document.querySelector('#locks-body tr[data-key="pool/slots"]');
		return tr !== null && tr.querySelector('td.key .kind').textContent === 'semaphore 2/3' &&
			tr.querySelector('td.owner').textContent === 'report-job\nslot-2' &&
			tr.querySelector('td.token').textContent === %s })()`, js(tokenOf(slot1)+"\n"+tokenOf(slot2))))

	// Sessions (ListSessions; the admin has admin on every key, so sees
	// every session): owner, principal, TTL, time left, locks.
	waitFor(t, admin, "the holder's session is listed", fmt.Sprintf(`[...document.querySelectorAll('#sessions-body tr')].some(tr =>
		tr.querySelector('td.session').textContent === %s && tr.querySelector('td.owner').textContent === 'report-job' &&
		tr.querySelector('td.principal').textContent === 'worker' && tr.querySelector('td.ttl').textContent === '3s' &&
		/^[0-3]s$/.test(tr.querySelector('td.left').textContent) && tr.querySelector('td.locks').textContent === '2')`, js(sess.ID())))
	// Hot keys (issue 27): a key waited for and held shows in both
	// rankings with a positive sum.
	hotKey(t, ctx, srv, admin, sess)
	shot, err := chromedp.Run(admin, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(shot, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("screenshot is not a PNG (%d bytes)", len(shot))
	}
	png := filepath.Join(t.ArtifactDir(), "console.png")
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatalf("write screenshot: %v", err)
	}
	t.Logf("screenshot: %s", png)

	// Release: the rows disappear, the events are shown.
	for _, l := range []*client.Lock{slot1, slot2} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release(pool/slots): %v", err)
		}
	}
	waitFor(t, admin, "the pool/slots row disappears", `document.querySelector('#locks-body tr[data-key="pool/slots"]') === null`)
	if err := report.Release(ctx); err != nil {
		t.Fatalf("Release(jobs/report): %v", err)
	}
	waitFor(t, admin, "the jobs/report row disappears", rowGone("jobs/report"))
	waitFor(t, admin, "the released event is shown", eventShown("released", "jobs/report", tokenOf(report)))

	// Revoke: a reader (read only) confirms and is refused; the lock stays.
	target, err := sess.TryAcquire(ctx, "jobs/target")
	if err != nil {
		t.Fatalf("TryAcquire(jobs/target): %v", err)
	}
	reader, readerDialogs := tab(t, browser, true)
	run(t, reader, "open the console as reader", chromedp.Navigate(url))
	setToken(t, reader, tokens["reader"])
	waitFor(t, reader, "the reader sees jobs/target", rowIs("jobs/target", "report-job", sess.ID(), tokenOf(target), ""))
	waitFor(t, reader, "the reader may not list sessions (no lock, no admin)",
		`document.getElementById('sessions-error').textContent.startsWith('403 ACCESS_DENIED')`)
	run(t, reader, "the reader clicks Revoke", chromedp.Click(chromedp.CSS(`tr[data-key="jobs/target"] button.revoke`)))
	if msg := <-readerDialogs; !strings.Contains(msg, "Revoke jobs/target?") || !strings.Contains(msg, tokenOf(target)) {
		t.Errorf("the reader's confirmation = %q, want it to name the key and the token", msg)
	}
	waitFor(t, reader, "the refusal is shown",
		`[...document.querySelectorAll('#locks-body tr[data-key="jobs/target"] td.refused')].some(td => td.textContent.includes('403 ACCESS_DENIED'))`)
	select {
	case <-target.Done():
		t.Fatalf("jobs/target was lost after the reader's refused revoke: %v", target.Err())
	default:
	}
	waitFor(t, admin, "the admin still sees jobs/target", rowIs("jobs/target", "report-job", sess.ID(), tokenOf(target), ""))

	// An admin confirms: the lock is revoked, the holder learns it.
	run(t, admin, "the admin clicks Revoke", chromedp.Click(chromedp.CSS(`tr[data-key="jobs/target"] button.revoke`)))
	if msg := <-adminDialogs; !strings.Contains(msg, "Revoke jobs/target?") {
		t.Errorf("the admin's confirmation = %q, want it to name the key", msg)
	}
	select {
	case <-target.Done():
		if !errors.Is(target.Err(), client.ErrLockLost) {
			t.Errorf("jobs/target ended with %v, want client.ErrLockLost", target.Err())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("jobs/target was not lost after the admin's revoke\npage:\n%s", pageText(admin))
	}
	waitFor(t, admin, "the revoked event is shown", eventShown("revoked", "jobs/target", tokenOf(target)))
	waitFor(t, admin, "the jobs/target row disappears", rowGone("jobs/target"))
	waitFor(t, admin, "the revoke is reported", `document.getElementById('status').textContent.startsWith('Revoked jobs/target')`)

	// Filter by prefix: only pool/ keys and their events. jobs/other is
	// committed before pool/one, so a watch that saw it would show it
	// before pool/one's event.
	run(t, admin, "filter by pool/", chromedp.Clear(chromedp.ID("prefix")), chromedp.SendKeys(chromedp.ID("prefix"), "pool/"),
		chromedp.Click(chromedp.ID("apply")))
	waitFor(t, admin, "the filtered watch is live", `document.getElementById('watch-state').textContent === 'live'`)
	other, err := sess.TryAcquire(ctx, "jobs/other")
	if err != nil {
		t.Fatalf("TryAcquire(jobs/other): %v", err)
	}
	one, err := sess.TryAcquire(ctx, "pool/one")
	if err != nil {
		t.Fatalf("TryAcquire(pool/one): %v", err)
	}
	waitFor(t, admin, "pool/one is shown", rowIs("pool/one", "report-job", sess.ID(), tokenOf(one), ""))
	waitFor(t, admin, "pool/one's event is shown", eventShown("acquired", "pool/one", tokenOf(one)))
	if shown := eval[bool](t, admin, `[...document.querySelectorAll('#locks-body td.key, #events .key')].some(e => e.textContent.startsWith('jobs/'))`); shown {
		t.Errorf("a jobs/ key is shown under the filter pool/ (held: %s)", tokenOf(other))
	}
	// The hot keys follow the prefix: pool/slots (held, released) only.
	// Control: before the filter both tables showed hot/key.
	waitFor(t, admin, "only pool/ keys are hot under the filter", `(() => {
		const keys = [...document.querySelectorAll('#hot-wait-body td.hotkey, #hot-hold-body td.hotkey')].map(td => td.textContent);
		return keys.includes('pool/slots') && keys.every(k => k.startsWith('pool/')) })()`)
}

// hotKey makes hot/key hot on srv — held by sess, waited for by another
// session until sess releases it, then released by the waiter — and waits
// until the page shows it in the hot-keys panel by wait and by hold, each
// with a positive sum (GET /v1/hotkeys, C5 #ct5-console).
func hotKey(t *testing.T, ctx context.Context, srv *lockdtest.Server, page context.Context, sess *client.Session) {
	t.Helper()
	held, err := sess.TryAcquire(ctx, "hot/key")
	if err != nil {
		t.Fatalf("TryAcquire(hot/key): %v", err)
	}
	w, err := srv.Client.NewSession(ctx, client.WithOwner("hot-waiter", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = w.Close(context.Background()) }()
	granted := make(chan error, 1)
	go func() { // ends with ctx at the latest
		l, err := w.Acquire(ctx, "hot/key")
		if err == nil {
			err = l.Release(ctx)
		}
		granted <- err
	}()
	waitFor(t, page, "the hot/key waiter is shown", rowIs("hot/key", "report-job", sess.ID(), tokenOf(held), "1. "+w.ID()))
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release(hot/key): %v", err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("the waiter's Acquire and Release of hot/key: %v", err)
	}
	for _, table := range []string{"hot-wait-body", "hot-hold-body"} {
		waitFor(t, page, "hot/key in "+table+" with a positive sum", fmt.Sprintf(`[...document.querySelectorAll('#%s tr')].some(tr =>
			tr.querySelector('td.hotkey').textContent === 'hot/key' && parseInt(tr.querySelector('td.score').textContent, 10) > 0)`, table))
	}
	if w := eval[string](t, page, `document.getElementById('hot-window').textContent`); w != "(this server, the last 1m 00s at most)" {
		t.Errorf("the hot-keys window reads %q; want the server's 60 s", w)
	}
}

// eventCount is an expression: how many events of kind for key the list
// shows.
func eventCount(kind, key string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#events li')].filter(li => li.dataset.kind === %s &&
		li.querySelector('.key') !== null && li.querySelector('.key').textContent === %s).length`, js(kind), js(key))
}

// TestConsoleResumesWatch (issue #21 §2): the console's watch survives a
// restart of its server on the same address, from the last cursor it saw
// (C2 #ct2-watch-resume, #ct2-watch-progress), as the Go SDK does. A key
// taken while the server is down (through another replica) and one taken
// after the restart both show up; on etcd the resume is exact: those
// events appear, nothing before the restart appears twice, and no resync
// is shown; on PostgreSQL (no event history) the console shows a resync,
// re-reads the held keys (the key taken meanwhile is listed) and shows the
// events after it. Before, the console re-opened its watch from now: the
// event committed while it was away was never shown, and nothing said so.
func TestConsoleResumesWatch(t *testing.T) {
	browser := newBrowser(t)
	for _, kind := range lockdtest.Backends {
		t.Run(kind, func(t *testing.T) { consoleResumesWatch(t, browser, kind) })
	}
}

func consoleResumesWatch(t *testing.T, browser context.Context, kind string) {
	ctx := testkit.Context(t, 2*time.Minute)
	az, tokens := consoleAuth(t)
	ns := lockdtest.NewNamespace(t, kind)
	first := lockdtest.StartOn(t, ns, lockdtest.Options{Config: consoleConfig(""), Auth: az, NoClient: true})
	// Another replica takes the locks: its session is not the one restarted.
	other := lockdtest.StartOn(t, ns, lockdtest.Options{Auth: az,
		ClientOptions: []client.Option{client.WithBearerToken(tokens["worker"])}})
	page, _ := tab(t, browser, true)
	run(t, page, "open the console", chromedp.Navigate("http://"+first.HTTPAddr+"/console/"))
	setToken(t, page, tokens["admin"])
	sess, err := other.Client.NewSession(ctx, client.WithOwner("resume-job", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = sess.Close(context.Background()) }()
	take := func(key string) *client.Lock {
		t.Helper()
		l, err := sess.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire(%s): %v", key, err)
		}
		return l
	}
	before := take("resume/before")
	waitFor(t, page, "the event before the restart", eventShown("acquired", "resume/before", tokenOf(before)))

	if err := first.Stop(); err != nil {
		t.Fatalf("stop the console's server: %v", err)
	}
	waitFor(t, page, "the watch noticed", `document.getElementById('watch-state').textContent === 'reconnecting'`)
	away := take("resume/away") // while the console has no watch
	restarted := lockdtest.StartOn(t, ns, lockdtest.Options{Config: consoleConfig(first.HTTPAddr), Auth: az, NoClient: true})
	if restarted.HTTPAddr != first.HTTPAddr {
		t.Fatalf("restarted on %s; want the page's address %s", restarted.HTTPAddr, first.HTTPAddr)
	}
	waitFor(t, page, "the watch is live again", `document.getElementById('watch-state').textContent === 'live'`)
	after := take("resume/after")
	waitFor(t, page, "the event after the restart", eventShown("acquired", "resume/after", tokenOf(after)))
	switch kind {
	case "etcd":
		waitFor(t, page, "the event committed while the console was away", eventShown("acquired", "resume/away", tokenOf(away)))
		if n := eval[int](t, page, `document.querySelectorAll('#events li[data-kind="resync"]').length`); n != 0 {
			t.Errorf("etcd: %d resyncs shown; want 0 (the resume is exact)\npage:\n%s", n, pageText(page))
		}
	case "pg":
		waitFor(t, page, "a resync (PostgreSQL keeps no event history)", `document.querySelectorAll('#events li[data-kind="resync"]').length === 1`)
		waitFor(t, page, "the key taken while away, re-read", rowIs("resume/away", "resume-job", sess.ID(), tokenOf(away), ""))
	}
	for _, key := range []string{"resume/before", "resume/away", "resume/after"} {
		if n := eval[int](t, page, eventCount("acquired", key)); n > 1 {
			t.Errorf("the acquired event of %s is shown %d times; want once\npage:\n%s", key, n, pageText(page))
		}
	}
}

// TestConsoleLeavesSilentWatch (issue #21 §2): a watch stream whose path
// stops carrying anything — a paused proxy: no reset, no close, as a
// stopped server — is given up after the silence bound, three progress
// intervals (C2 #ct2-watch-progress), shown as reconnecting, and resumed
// from its cursor once the path is back: the event committed while it was
// silent is shown, once. Before, the console showed "live" forever.
func TestConsoleLeavesSilentWatch(t *testing.T) {
	srv, tokens := startConsole(t) // etcd: the resume is exact
	ctx := testkit.Context(t, 2*time.Minute)
	proxy := testkit.NewProxy(t, srv.HTTPAddr)
	page, _ := tab(t, newBrowser(t), true)
	run(t, page, "open the console through the proxy", chromedp.Navigate("http://"+proxy.Addr()+"/console/"))
	setToken(t, page, tokens["admin"])
	sess, err := srv.Client.NewSession(ctx, client.WithOwner("silent-job", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = sess.Close(context.Background()) }()
	before, err := sess.TryAcquire(ctx, "silent/before")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	// The stream's first line, a progress telling the interval, came
	// before this event.
	waitFor(t, page, "the event before the silence", eventShown("acquired", "silent/before", tokenOf(before)))

	proxy.Pause()
	paused := time.Now()
	waitFor(t, page, "the silent watch given up", `document.getElementById('watch-state').textContent === 'reconnecting'`)
	// The progress interval is lockdtest's TTL/3; the bound is three of
	// it. The page's timers and this poll (every 100 ms) may lag on a
	// loaded two-core machine: one more bound is ample.
	bound := 3 * (lockdtest.TTL / 3)
	if took := time.Since(paused); took > 2*bound {
		t.Errorf("the console gave up its silent watch %v after the pause; want within %v (bound %v)", took, 2*bound, bound)
	}
	t.Logf("gave up the silent watch %v after the pause", time.Since(paused).Round(time.Millisecond))
	away, err := sess.TryAcquire(ctx, "silent/away")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	proxy.Restore()
	waitFor(t, page, "the watch is live again", `document.getElementById('watch-state').textContent === 'live'`)
	waitFor(t, page, "the event committed while the watch was silent", eventShown("acquired", "silent/away", tokenOf(away)))
	for _, key := range []string{"silent/before", "silent/away"} {
		if n := eval[int](t, page, eventCount("acquired", key)); n != 1 {
			t.Errorf("the acquired event of %s is shown %d times; want once\npage:\n%s", key, n, pageText(page))
		}
	}
}
