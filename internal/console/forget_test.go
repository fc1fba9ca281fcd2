package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
)

// holdListCalls makes the page's GET /v1/locks calls wait until the test
// lets each go (window.__held[i].go()), noting the Authorization each was
// sent with.
const holdListCalls = `(() => {
  const orig = window.fetch;
  window.__held = [];
  window.fetch = (input, init) => {
    if (!String(input).includes('/v1/locks?')) return orig(input, init);
    const auth = (init && init.headers && init.headers.Authorization) || '';
    return new Promise((resolve, reject) => window.__held.push({ auth, go: () => orig(input, init).then(resolve, reject) }));
  };
  return true;
})()`

// TestConsoleForgetDropsStaleAnswer: "Forget token" while a list call
// sent with the token is still in flight clears what the token showed, and
// the answer that arrives afterwards is not drawn (the page's generation
// moved on); the next call goes without the token.
func TestConsoleForgetDropsStaleAnswer(t *testing.T) {
	srv, tokens := startConsole(t)
	ctx := testkit.Context(t, time.Minute)
	browser := newBrowser(t)
	pg, _ := tab(t, browser, true)
	run(t, pg, "open the console", chromedp.Navigate("http://"+srv.HTTPAddr+"/console/"))
	setToken(t, pg, tokens["admin"])

	sess, err := srv.Client.NewSession(ctx, client.WithOwner("forget-job", nil))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer func() { _ = sess.Close(context.Background()) }()
	l, err := sess.TryAcquire(ctx, "jobs/forget")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	waitFor(t, pg, "the admin sees jobs/forget", rowIs("jobs/forget", "forget-job", sess.ID(), tokenOf(l), ""))

	eval[bool](t, pg, holdListCalls)
	waitFor(t, pg, "a list call with the admin's token is in flight",
		`window.__held.length >= 1 && window.__held[0].auth !== ''`)
	run(t, pg, "forget the token", chromedp.Click(chromedp.ID("forget")))
	eval[bool](t, pg, `(window.__held[0].go(), true)`)
	// The next list call starts only once the refresh that made the held
	// call is over, so the stale answer has been handled by then.
	waitFor(t, pg, "the next list call is sent", `window.__held.length >= 2`)
	if auth := eval[string](t, pg, `window.__held[1].auth`); auth != "" {
		t.Fatalf("the list call after Forget was sent with Authorization %q", auth)
	}
	if n := eval[int](t, pg, `document.querySelectorAll('#locks-body tr').length`); n != 0 {
		t.Fatalf("after Forget the page shows %d rows of the forgotten token's answer:\n%s", n, pageText(pg))
	}
}
