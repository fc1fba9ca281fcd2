package sdk_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// tsPolicy gives alice every right on every key; anonymous callers none.
const tsPolicy = `
rules:
  - name: alice
    principals: [alice]
    prefixes: ["*"]
    allow: [read, lock, admin]
  - name: locker
    principals: [locker]
    prefixes: ["lockonly/"]
    allow: [lock]
`

// tsReplicas: the failover test drains one replica and kills another,
// ending on the third.
const tsReplicas = 5

// TestTypeScriptSDK runs sdk/typescript's tests against real lockd servers:
// npm ci (the committed package-lock.json; its prepare script is the one tsc
// build), the unit tests
// (the timing rules under a fake clock), then per backend the integration
// tests (the README quickstart included) and the replica failover test, and
// the TLS/mTLS and bearer-token tests, and the package's npm pack and
// install (tsPackaging). It fails if any test fails or is
// skipped. LOCKD_TSSDK_RUN narrows the node tests (--test-name-pattern).
func TestTypeScriptSDK(t *testing.T) {
	t.Parallel() // beside TestPythonSDK (doc.go)
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not on PATH (Debian: apt-get install nodejs npm): %v", tool, err)
		}
	}
	dir := tsWorkdir(t)
	readme, err := filepath.Abs(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel) // after the parallel subtests, which run once this function has returned
	// The locked dependencies (the npm cache makes a second run offline),
	// then the package's prepare script: tsc once, src and tests.
	tsRun(t, ctx, dir, nil, "npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	if _, err := os.Stat(filepath.Join(dir, "dist", "test", "unit", "timing.test.js")); err != nil {
		t.Fatalf("npm ci did not build the package (prepare: tsc): %v", err)
	}

	node := func(t *testing.T, env map[string]string, files ...string) {
		t.Helper()
		args := []string{"--test", "--test-reporter=tap", "--test-concurrency=1"}
		if p := os.Getenv("LOCKD_TSSDK_RUN"); p != "" {
			args = append(args, "--test-name-pattern="+p)
		}
		out := tsRun(t, ctx, dir, env, "node", append(args, files...)...)
		tsSummary(t, out, os.Getenv("LOCKD_TSSDK_RUN") != "")
	}

	t.Run("unit", func(t *testing.T) {
		node(t, nil, "dist/test/unit/")
	})
	t.Run("packaging", func(t *testing.T) { tsPackaging(t, ctx, dir) })
	t.Run("bench-rows", func(t *testing.T) { benchSDKRows(t, ctx, dir) })
	for _, b := range lockdtest.Backends {
		t.Run(b, func(t *testing.T) {
			// The backends' runs in parallel, after the security run (the
			// parent's own subtests first): servers, replicas, proxies and
			// control endpoint of their own; the built package is only read.
			t.Parallel()
			// With the HTTP/JSON API too (the HTTP transport's test).
			hcfg := lockdtest.Config()
			hcfg.HTTPListen = "127.0.0.1:0"
			srv := lockdtest.StartBackend(t, b, lockdtest.Options{NoClient: true, Config: &hcfg})
			// Replicas drain at stop (C2 #ct2-drain), so that the SDK is told to move.
			cfg := lockdtest.Config()
			cfg.DrainTimeout = 5 * time.Second
			ns := lockdtest.NewNamespace(t, b)
			var set []*lockdtest.Server
			var addrs []string
			for range tsReplicas {
				r := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true, Config: &cfg})
				set = append(set, r)
				addrs = append(addrs, r.Addr)
			}
			// Three more with the HTTP/JSON API too (replicas tsReplicas to
			// tsReplicas+2 of the control): the HTTP transport's drain-then-kill
			// test.
			hrcfg := cfg
			hrcfg.HTTPListen = "127.0.0.1:0"
			var httpAddrs []string
			for range 3 {
				r := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true, Config: &hrcfg})
				set = append(set, r)
				httpAddrs = append(httpAddrs, r.HTTPAddr)
			}
			// A proxy in front of the first server (the outage tests pause and
			// cut it) and one in front of the last replica (the failover test
			// stalls it).
			proxies := map[string]*testkit.Proxy{"server": testkit.NewProxy(t, srv.Addr),
				"replica":     testkit.NewProxy(t, addrs[len(addrs)-1]),
				"httpreplica": testkit.NewProxy(t, httpAddrs[len(httpAddrs)-1])} // the HTTP stall test's
			node(t, map[string]string{
				"LOCKDTEST_BACKEND": b, "LOCKDTEST_ADDR": srv.Addr, "LOCKDTEST_PROXY": proxies["server"].Addr(),
				"LOCKDTEST_REPLICA_PROXY": proxies["replica"].Addr(),
				"LOCKDTEST_REPLICAS":      strings.Join(addrs, ","), "LOCKDTEST_CONTROL": tsControl(t, set, proxies),
				"LOCKDTEST_REPO_README": readme, "LOCKDTEST_HTTP_ADDR": srv.HTTPAddr,
				"LOCKDTEST_HTTP_REPLICAS": strings.Join(httpAddrs, ","), "LOCKDTEST_HTTP_REPLICA_FIRST": strconv.Itoa(tsReplicas),
				"LOCKDTEST_HTTP_REPLICA_PROXY": proxies["httpreplica"].Addr(),
			}, "dist/test/integration/lockd.test.js", "dist/test/integration/http.test.js", "dist/test/integration/readme.test.js",
				"dist/test/integration/failover.test.js", "dist/test/integration/outage.test.js",
				"dist/test/integration/agent.test.js", "dist/test/integration/hotkeys.test.js",
				"dist/test/integration/acquire_all.test.js", "dist/test/integration/wait_estimate.test.js",
				"dist/test/integration/wait_updates.test.js")
		})
	}
	t.Run("security", func(t *testing.T) {
		files := t.TempDir()
		ca := testkit.NewCA(t, "tssdk-ca")
		caFile := ca.WriteCA(t, files, "ca.crt")
		srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, files, "server")
		cliCert, cliKey := ca.Issue(t, testkit.CertOptions{CommonName: "tssdk"}).Write(t, files, "client")
		tcfg := lockdtest.Config()
		tcfg.TLSCertFile, tcfg.TLSKeyFile, tcfg.TLSClientCAFile, tcfg.TLSClientAuth = srvCert, srvKey, caFile, "require"
		tcfg.HTTPListen = "127.0.0.1:0" // HTTPS with the same TLS (the HTTP transport's test)
		tsrv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Config: &tcfg})

		const token = "tssdk-token-of-alice-0123456789abcdef"
		const lockerToken = "tssdk-token-of-locker-0123456789abcdef" // lock but not read under lockonly/
		write := func(name, content string) string {
			p := filepath.Join(files, name)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}
		az, err := auth.New(auth.Config{PolicyFile: write("policy.yaml", tsPolicy),
			TokensFile: write("tokens", auth.HashToken(token)+" alice\n"+auth.HashToken(lockerToken)+" locker\n")}, auth.Options{})
		if err != nil {
			t.Fatalf("auth.New: %v", err)
		}
		t.Cleanup(func() { _ = az.Close() })
		acfg := lockdtest.Config()
		acfg.HTTPListen = "127.0.0.1:0"
		asrv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Auth: az, Config: &acfg})
		node(t, map[string]string{
			"LOCKDTEST_TLS_ADDR": tsrv.Addr, "LOCKDTEST_TLS_CA": caFile, "LOCKDTEST_TLS_CERT": cliCert,
			"LOCKDTEST_TLS_KEY": cliKey, "LOCKDTEST_TOKEN_ADDR": asrv.Addr, "LOCKDTEST_TOKEN_FILE": write("token", token+"\n"),
			"LOCKDTEST_LOCKER_TOKEN_FILE": write("locker-token", lockerToken+"\n"),
			"LOCKDTEST_TLS_HTTP_ADDR":     tsrv.HTTPAddr, "LOCKDTEST_TOKEN_HTTP_ADDR": asrv.HTTPAddr,
		}, "dist/test/integration/security.test.js")
	})
}

// tsWorkdir copies the package's sources (not node_modules or dist) into a
// directory of the test's own, so that npm ci and tsc never touch the
// working tree.
func tsWorkdir(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "sdk", "typescript")
	dst := filepath.Join(t.TempDir(), "typescript")
	for _, name := range []string{"package.json", "package-lock.json", "tsconfig.json", "README.md", "src", "test"} {
		from, to := filepath.Join(src, name), filepath.Join(dst, name)
		fi, err := os.Stat(from)
		if err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() {
			err = os.CopyFS(to, os.DirFS(from))
		} else if err = os.MkdirAll(dst, 0o755); err == nil {
			var b []byte
			if b, err = os.ReadFile(from); err == nil {
				err = os.WriteFile(to, b, 0o644)
			}
		}
		if err != nil {
			t.Fatalf("copy %s: %v", from, err)
		}
	}
	return dst
}

// tsRun runs a command in dir with the extra environment and returns its
// combined output; it fails the test, showing the output, if it fails.
func tsRun(t *testing.T, ctx context.Context, dir string, env map[string]string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "npm_config_update_notifier=false")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v (after %v)\n%s", name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s %s: ok in %v", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// tsSummary checks node's TAP summary: tests ran, none failed, none skipped
// (unless a name pattern narrowed the run, which node reports as skips).
func tsSummary(t *testing.T, out string, narrowed bool) {
	t.Helper()
	counts := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out))
	re := regexp.MustCompile(`^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$`)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "not ok") || strings.HasPrefix(line, "ok ") {
			t.Log(line)
		}
		if m := re.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[2])
			counts[m[1]] += n
		} else if d, ok := strings.CutPrefix(strings.TrimSpace(line), "# "); ok && !strings.HasPrefix(d, "Subtest:") &&
			!strings.HasPrefix(d, "suites ") && !strings.HasPrefix(d, "duration_ms ") {
			t.Log("  " + d) // a test's diagnostic (t.diagnostic): its figures
		}
	}
	switch {
	case counts["fail"] > 0 || counts["cancelled"] > 0:
		t.Fatalf("node tests failed: %v\n%s", counts, out)
	case counts["pass"] == 0 && !narrowed:
		t.Fatalf("node ran no test: %v\n%s", counts, out)
	case counts["skipped"]+counts["todo"] > 0 && !narrowed:
		t.Fatalf("node skipped tests: every test must run here: %v\n%s", counts, out)
	}
	t.Logf("node tests: %d passed", counts["pass"])
}

// tsControl serves, on loopback, POST /replica/{i}/{stop|kill} for the
// failover test (stop drains the replica and returns once it stopped; kill
// drops it at once) and POST /proxy/{name}/{pause|cut|restore} for the
// outage tests. It returns the base URL and stops with the test.
func tsControl(t *testing.T, set []*lockdtest.Server, proxies map[string]*testkit.Proxy) string {
	t.Helper()
	var mu sync.Mutex // one action at a time
	mux := http.NewServeMux()
	mux.HandleFunc("POST /proxy/{name}/{action}", func(w http.ResponseWriter, r *http.Request) {
		proxy := proxies[r.PathValue("name")]
		if proxy == nil {
			http.Error(w, "no such proxy", http.StatusNotFound)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.PathValue("action") {
		case "pause":
			proxy.Pause()
		case "cut":
			proxy.Cut()
		case "restore":
			proxy.Restore()
		default:
			http.Error(w, "want pause, cut or restore", http.StatusNotFound)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("POST /replica/{i}/{action}", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.PathValue("i"))
		if err != nil || i < 0 || i >= len(set) {
			http.Error(w, "no such replica", http.StatusNotFound)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch r.PathValue("action") {
		case "stop":
			err = set[i].Stop()
		case "kill":
			err = set[i].Kill()
		default:
			http.Error(w, "want stop or kill", http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { // exits when the server is closed in Cleanup
		defer close(done)
		_ = hs.Serve(lis)
	}()
	t.Cleanup(func() {
		_ = hs.Close()
		<-done
	})
	return "http://" + lis.Addr().String()
}
