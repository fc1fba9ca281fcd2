package cli

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// readmeHTTPSection is the README section whose blocks TestReadmeHTTPCurl
// runs.
const readmeHTTPSection = "## Using lockd from any language"

// readmeHTTPAddr is the HTTP/JSON address the README's blocks use.
const readmeHTTPAddr = "127.0.0.1:7422"

var servingHTTPLine = regexp.MustCompile(`^lockd serving grpc=\S+ metrics=\S+ backend=\S+ http=(\S+)\n$`)

// TestReadmeHTTPCurl runs the README's "Using lockd from any language"
// section with curl and jq against `lockd serve`: the serve command as
// written (plus loopback port 0 for every listener and a temp data dir),
// the watch command in the background (with -v, to see when its response
// headers arrive: the watch is established), then the other blocks as one
// sh -e script in a temp dir, with the README's address replaced by the
// server's. It asserts what the blocks print (the session and its
// deadline, the grant and its token, the heartbeat's remaining_ms and held
// lock, inspect's token, the release, the close, the error's status and
// reason) and what the watch saw (the grant and the release, with the
// token). So the README cannot drift from the API.
func TestReadmeHTTPCurl(t *testing.T) {
	for _, tool := range []string{"curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's HTTP examples need %s (Debian: apt-get install %s): %v", tool, tool, err)
		}
	}
	var serveArgs []string
	var watchCmd string
	var script strings.Builder
	for _, b := range readmeBlocks(t, readmeHTTPSection) {
		if b.lang != "sh" {
			t.Fatalf("README section %q: code block %q is not sh; teach TestReadmeHTTPCurl to run it", readmeHTTPSection, b.lang)
		}
		body := strings.Join(b.lines, "\n")
		switch {
		case strings.HasPrefix(body, "lockd serve "):
			serveArgs = shSplit(t, body)[1:]
		case strings.Contains(body, "/v1/watch"):
			watchCmd = body
		default:
			script.WriteString(body + "\n")
		}
	}
	if serveArgs == nil || watchCmd == "" || script.Len() == 0 {
		t.Fatalf("README section %q: want a `lockd serve` block, a watch block and the curl blocks", readmeHTTPSection)
	}
	i := slices.Index(serveArgs, "--http-listen")
	if i < 0 || i+1 >= len(serveArgs) || serveArgs[i+1] != readmeHTTPAddr {
		t.Fatalf("README serve command %v: want --http-listen %s", serveArgs, readmeHTTPAddr)
	}
	serveArgs[i+1] = "127.0.0.1:0"
	dir := t.TempDir()
	srv := start(t, []string{"LOCKD_EMBEDDED_DATA_DIR=" + t.TempDir()},
		append([]string{"serve", "--listen=127.0.0.1:0", "--metrics-listen=off"}, serveArgs[1:]...)...)
	testkit.Eventually(t, 60*time.Second, "lockd serve's line", func() bool {
		select {
		case <-srv.done:
			t.Fatalf("lockd serve exited with %d\nstderr:\n%s", srv.code, srv.stderr)
		default:
		}
		return strings.HasSuffix(srv.stdout.String(), "\n")
	})
	m := servingHTTPLine.FindStringSubmatch(srv.stdout.String())
	if m == nil {
		t.Fatalf("lockd serve printed %q; want %q", srv.stdout, servingHTTPLine)
	}
	addr := m[1]

	// The watch, in the background until the script is done.
	watch := exec.Command("sh", "-c", "exec "+strings.ReplaceAll(watchCmd, readmeHTTPAddr, addr)+" -v")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := watch.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatalf("starting the README's watch: %v", err)
	}
	established := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // exits when curl's stderr closes
		defer wg.Done()
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "< HTTP/1.1 200") {
				once.Do(func() { close(established) })
			}
		}
	}()
	events := make(chan map[string]any, 1000)
	go func() { // exits when curl's stdout closes
		defer wg.Done()
		defer close(events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				select {
				case events <- ev:
				default: // more than the test reads: dropped
				}
			}
		}
	}()
	stopWatch := sync.OnceFunc(func() {
		_ = watch.Process.Kill() // our own child, by its process
		wg.Wait()
		_ = watch.Wait()
	})
	t.Cleanup(stopWatch)
	select {
	case <-established:
	case <-time.After(30 * time.Second):
		t.Fatal("the README's watch did not get its response headers within 30s")
	}

	cmd := exec.Command("sh", "-e", "-c", strings.ReplaceAll(script.String(), readmeHTTPAddr, addr))
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if err != nil {
		t.Fatalf("README curl blocks failed: %v\n%s", err, out)
	}
	t.Logf("README curl blocks:\n%s", out)
	for _, re := range []string{
		`(?m)^session [A-Z0-9]+, heartbeat every 5000 ms, trusted until \d{13}$`,
		`(?m)^granted jobs/report with token \d+$`,
		`(?m)^\{"live":true,"remaining_ms":"\d+","held":\[\{"key":"jobs/report","token":"\d+"\}\]\}$`,
		`(?m)^\{"key":"jobs/report","token":"\d+","owner":"report-job"\}$`,
		`(?m)^\{\}$`,
		`(?m)^\{"released":"0"\}$`,
		`(?m)^403 SESSION_SECRET_MISMATCH$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("README curl output has no line matching %s", re)
		}
	}
	token := regexp.MustCompile(`granted jobs/report with token (\d+)`).FindStringSubmatch(out)
	if token == nil {
		t.Fatal("no token in the output")
	}
	for _, tok := range regexp.MustCompile(`"token":"(\d+)"`).FindAllStringSubmatch(out, -1) {
		if tok[1] != token[1] {
			t.Errorf("token %s in the output; want only the grant's %s", tok[1], token[1])
		}
	}

	// The watch saw the grant and the release, with the token.
	want := []string{"EVENT_KIND_ACQUIRED", "EVENT_KIND_RELEASED"}
	var got []string
	timeout := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the watch ended after %v", got)
			}
			r, _ := ev["result"].(map[string]any)
			if r["key"] != "jobs/report" {
				continue
			}
			if tok, _ := r["token"].(string); tok != token[1] {
				t.Errorf("watch event %v; want token %s", r, token[1])
			}
			kind, _ := r["kind"].(string)
			got = append(got, kind)
		case <-timeout:
			t.Fatalf("watch events of jobs/report within 30s: %v; want %v", got, want)
		}
	}
	stopWatch()
	if !slices.Equal(got, want) {
		t.Errorf("watch events of jobs/report = %v; want %v", got, want)
	}
}
