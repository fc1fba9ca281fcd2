package console_test

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"lock.dev/lockd/internal/console"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// noRedirect is an HTTP client that reports redirects instead of following
// them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, url, err)
	}
	return resp, string(body)
}

// TestConsoleServed: with lock.server.http.console on, the HTTP listener
// serves the page and its assets under /console/ with the security headers
// of C5 #ct5-console, refuses other methods and paths, and still serves the
// API; with it off (the default) /console/ is the API's 404.
func TestConsoleServed(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPConsole = true
	on := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg, NoClient: true})
	base := "http://" + on.HTTPAddr

	for path, ctype := range map[string]string{
		"/console/":            "text/html; charset=utf-8",
		"/console/index.html":  "text/html; charset=utf-8",
		"/console/console.js":  "text/javascript; charset=utf-8",
		"/console/console.css": "text/css; charset=utf-8",
	} {
		resp, body := get(t, http.MethodGet, base+path)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctype || body == "" {
			t.Errorf("GET %s = %d %q (%d bytes), want 200 %q with a body", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body), ctype)
		}
		for h, want := range map[string]string{
			"Content-Security-Policy": console.CSP,
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
		} {
			if got := resp.Header.Get(h); got != want {
				t.Errorf("GET %s: %s = %q, want %q", path, h, got, want)
			}
		}
	}
	if !strings.Contains(console.CSP, "frame-ancestors 'none'") || !strings.Contains(console.CSP, "script-src 'self';") ||
		strings.Contains(console.CSP, "unsafe") {
		t.Errorf("CSP %q: want frame-ancestors 'none', scripts from self only, nothing unsafe", console.CSP)
	}
	if resp, _ := get(t, http.MethodGet, base+"/console"); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console = %d Location %q, want 301 to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := get(t, http.MethodPost, base+"/console/"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /console/ = %d, want 405", resp.StatusCode)
	}
	for _, path := range []string{"/console/nope.js", "/console/assets/console.js", "/console/../v1/locks"} {
		if resp, _ := get(t, http.MethodGet, base+path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, resp.StatusCode)
		}
	}
	if resp, body := get(t, http.MethodGet, base+"/v1/locks?prefix=jobs/"); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"locks"`) {
		t.Errorf("GET /v1/locks with the console on = %d %s, want 200 and the list", resp.StatusCode, body)
	}

	offCfg := lockdtest.Config()
	offCfg.HTTPListen = "127.0.0.1:0"
	off := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &offCfg, NoClient: true})
	resp, body := get(t, http.MethodGet, "http://"+off.HTTPAddr+"/console/")
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Security-Policy") != "" || strings.Contains(body, "<html") {
		t.Errorf("GET /console/ with the console off = %d %q, want the API's 404", resp.StatusCode, body)
	}
}

// Patterns no console asset may contain: inline script or style (the CSP
// forbids them, and they would be a place for markup injection) and the
// DOM calls that parse strings as HTML or code.
var (
	scriptTag  = regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`)
	inlineHTML = regexp.MustCompile(`(?i)<style\b|\sstyle=|\son[a-z]+=|javascript:`)
	unsafeJS   = regexp.MustCompile(`\.innerHTML\b|\.outerHTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function\(|setTimeout\(['"]`)
)

// inline returns the first inline script, style or handler of page.
func inline(page string) string {
	for _, m := range scriptTag.FindAllStringSubmatch(page, -1) {
		if !strings.Contains(m[1], " src=") || strings.TrimSpace(m[2]) != "" {
			return m[0]
		}
	}
	return inlineHTML.FindString(page)
}

// TestAssetsHaveNoMarkupSinks checks the embedded sources: the page has no
// inline script, style or event handler, and the script never turns a
// string into markup or code (every server string goes in as textContent).
// Controls: each pattern finds what it must.
func TestAssetsHaveNoMarkupSinks(t *testing.T) {
	for _, c := range []struct {
		re   *regexp.Regexp
		text string
	}{
		{nil, `<script>alert(1)</script>`},
		{nil, `<script src="a.js">alert(1)</script>`},
		{nil, `<button onclick="x()">`},
		{nil, `<p style="color:red">`},
		{unsafeJS, `td.innerHTML = key;`},
		{unsafeJS, `li.insertAdjacentHTML('beforeend', k)`},
	} {
		if c.re == nil && inline(c.text) == "" || c.re != nil && !c.re.MatchString(c.text) {
			t.Errorf("control: %q is not found (the check would be blind)", c.text)
		}
	}
	page, err := os.ReadFile("assets/index.html")
	if err != nil {
		t.Fatal(err)
	}
	if m := inline(string(page)); m != "" {
		t.Errorf("index.html has inline script or style: %q", m)
	}
	if !strings.Contains(string(page), `<script src="console.js" defer></script>`) {
		t.Error("index.html does not load console.js")
	}
	script, err := os.ReadFile("assets/console.js")
	if err != nil {
		t.Fatal(err)
	}
	if m := unsafeJS.FindString(string(script)); m != "" {
		t.Errorf("console.js parses strings as markup or code: %q", m)
	}
}
