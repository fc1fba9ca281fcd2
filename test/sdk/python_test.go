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

func TestMain(m *testing.M) { lockdtest.Main(m) }

// python is Debian's interpreter, which has python3-grpcio and
// python3-protobuf (a python3 earlier on PATH may be another one).
const python = "/usr/bin/python3"

// tokenPolicy gives alice lock and read on every key, and locker lock but
// not read under lockonly/ (waiting updates refused, C2 #ct2-wait-updates).
const tokenPolicy = `
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

// replicasPerBackend: the failover test drains one and kills another,
// ending on the third.
const replicasPerBackend = 3

// TestPythonSDK runs sdk/python's tests (unit tests under a fake clock and
// integration tests) against real lockd servers on both backends. It fails
// if any Python test fails or is skipped.
func TestPythonSDK(t *testing.T) {
	t.Parallel() // beside TestTypeScriptSDK: each mostly waits (issue 21, CI time; doc.go)
	if out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc and protobuf (apt-get install python3-grpcio python3-protobuf): %v\n%s",
			python, err, out)
	}
	env := map[string]string{}
	var backends []string
	replicas := map[string][]*lockdtest.Server{}
	for _, b := range lockdtest.Backends {
		backends = append(backends, b)
		srv := lockdtest.StartBackend(t, b, lockdtest.Options{NoClient: true})
		env["PYSDK_ADDR_"+b] = srv.Addr
		// Replicas drain at stop (C2 #ct2-drain) so that the SDK is told to move.
		cfg := lockdtest.Config()
		cfg.DrainTimeout = 5 * time.Second
		ns := lockdtest.NewNamespace(t, b)
		var addrs []string
		for range replicasPerBackend {
			r := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true, Config: &cfg})
			replicas[b] = append(replicas[b], r)
			addrs = append(addrs, r.Addr)
		}
		env["PYSDK_REPLICAS_"+b] = strings.Join(addrs, ",")
		// Two more of the same backend for lockd.aio's failover test
		// (tests/test_aio_failover.py kills the first), controlled as
		// backend "aio-"+b.
		addrs = nil
		for range 2 {
			r := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true, Config: &cfg})
			replicas["aio-"+b] = append(replicas["aio-"+b], r)
			addrs = append(addrs, r.Addr)
		}
		env["PYSDK_AIO_REPLICAS_"+b] = strings.Join(addrs, ",")
	}
	env["PYSDK_BACKENDS"] = strings.Join(backends, ",")

	// mTLS: a CA of the test's, the server requires a client certificate.
	dir := t.TempDir()
	ca := testkit.NewCA(t, "pysdk-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	cliCert, cliKey := ca.Issue(t, testkit.CertOptions{CommonName: "pysdk"}).Write(t, dir, "client")
	tcfg := lockdtest.Config()
	tcfg.TLSCertFile, tcfg.TLSKeyFile, tcfg.TLSClientCAFile, tcfg.TLSClientAuth = srvCert, srvKey, caFile, "require"
	tsrv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Config: &tcfg})
	env["PYSDK_TLS_ADDR"], env["PYSDK_TLS_CA"], env["PYSDK_TLS_CERT"], env["PYSDK_TLS_KEY"] = tsrv.Addr, caFile, cliCert, cliKey

	// Bearer tokens: alice's token maps to a principal with every right.
	const token = "pysdk-token-of-alice-0123456789abcdef"
	const lockerToken = "pysdk-token-of-locker-0123456789abcdef"
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	az, err := auth.New(auth.Config{PolicyFile: write("policy.yaml", tokenPolicy),
		TokensFile: write("tokens", auth.HashToken(token)+" alice\n"+auth.HashToken(lockerToken)+" locker\n")}, auth.Options{})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(func() { _ = az.Close() })
	asrv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Auth: az})
	env["PYSDK_TOKEN_ADDR"], env["PYSDK_TOKEN_FILE"] = asrv.Addr, write("token", token+"\n")
	env["PYSDK_LOCKER_TOKEN_FILE"] = write("locker-token", lockerToken+"\n")

	env["PYSDK_CONTROL"] = control(t, replicas)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."}
	if k := os.Getenv("LOCKD_PYSDK_RUN"); k != "" {
		args = append(args, "-k", k) // a developer's focus: unittest's -k pattern
	}
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Dir = filepath.Join("..", "..", "sdk", "python")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	summary := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		if strings.HasPrefix(line, "Ran ") || strings.HasPrefix(line, "OK") || strings.HasPrefix(line, "FAILED") {
			summary += line + " "
		}
	}
	if err != nil {
		t.Fatalf("python unittest: %v (%s)", err, summary)
	}
	if m := regexp.MustCompile(`skipped=(\d+)`).FindStringSubmatch(summary); m != nil {
		t.Fatalf("python unittest skipped %s tests: every test must run here (%s)", m[1], summary)
	}
	if !strings.Contains(summary, "Ran ") {
		t.Fatalf("python unittest ran no test: %s", summary)
	}
	t.Logf("python SDK: %s", summary)
}

// control serves POST /replica/{backend}/{i}/{stop|kill} on loopback: stop
// drains the replica and returns once it stopped; kill drops it at once.
// It returns the base URL and stops with the test.
func control(t *testing.T, replicas map[string][]*lockdtest.Server) string {
	t.Helper()
	var mu sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("POST /replica/{backend}/{i}/{action}", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.PathValue("i"))
		mu.Lock()
		set := replicas[r.PathValue("backend")]
		mu.Unlock()
		if err != nil || i < 0 || i >= len(set) {
			http.Error(w, "no such replica", http.StatusNotFound)
			return
		}
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
	go func() { // exits when the server is shut down below
		defer close(done)
		_ = hs.Serve(lis)
	}()
	t.Cleanup(func() {
		_ = hs.Close()
		<-done
	})
	return "http://" + lis.Addr().String()
}
