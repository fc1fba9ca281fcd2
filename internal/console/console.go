// Package console is lockd's read-only web console (C5 #ct5-console): one
// HTML page, one script and one style sheet, embedded in the binary and
// served under /console/ on the HTTP/JSON API listener when
// lock.server.http.console is on.
//
// The assets are static and public: the same bytes for every caller, no
// data, no template. Everything the page shows it fetches from the JSON API
// (docs/contracts/C2.md #ct2-http) in the browser, with the caller's own
// credentials (a bearer token typed into the page, or the browser's client
// certificate), so it shows exactly what the caller's access rules allow and
// adds no route, identity or permission of its own. There is no build step:
// the files under assets/ are what the browser runs.
package console

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console/"

// CSP is the Content-Security-Policy of every console response: scripts,
// styles and API calls from this origin only, no inline script or style,
// never framed (C5 #ct5-console).
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// files are the assets by their path under Prefix ("" is the page).
var files = map[string]struct{ name, ctype string }{
	"":            {"assets/index.html", "text/html; charset=utf-8"},
	"index.html":  {"assets/index.html", "text/html; charset=utf-8"},
	"console.js":  {"assets/console.js", "text/javascript; charset=utf-8"},
	"console.css": {"assets/console.css", "text/css; charset=utf-8"},
}

// Refusal writes a refusal with HTTP status 404, 405 or 500 in the API's
// JSON error shape (C2 #ct2-http-refusals); the server passes its own, so
// the console has the API's reasons without knowing them.
type Refusal func(w http.ResponseWriter, httpStatus int)

// Handler serves the console: GET or HEAD of /console/ (the page) and of its
// assets, /console redirected to /console/, 404 for any other path under
// /console/, 405 for another method, both written by refuse. It sets the
// security headers of C5 #ct5-console on every answer. Route only /console
// and /console/… to it.
func Handler(refuse Refusal) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(w, r, refuse) })
}

// modTime is when the assets were built into this binary (embed gives
// none): the process start, so conditional requests work within one run.
var modTime = time.Now()

func serve(w http.ResponseWriter, r *http.Request, refuse Refusal) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		refuse(w, http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	f, known := files[rest]
	if !ok || !known {
		refuse(w, http.StatusNotFound)
		return
	}
	body, err := fs.ReadFile(assets, f.name)
	if err != nil { // the embedded set is fixed at build time
		refuse(w, http.StatusInternalServerError)
		return
	}
	h.Set("Content-Type", f.ctype)
	// No ranges and no preconditions but the caching ones: a few KiB need no
	// 206, and ServeContent's 412 and 416 are plain text (C2
	// #ct2-http-refusals).
	r = r.Clone(r.Context())
	for _, k := range []string{"Range", "If-Range", "If-Match", "If-Unmodified-Since"} {
		r.Header.Del(k)
	}
	http.ServeContent(w, r, path.Base(f.name), modTime, bytes.NewReader(body))
}
