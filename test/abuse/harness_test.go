package abuse

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// Bounds on a loaded two-core machine.
const (
	startTimeout = 90 * time.Second // until the ready line (embedded etcd fsyncs on start)
	runTimeout   = 60 * time.Second // one client command
	// The session TTL the suite serves (lockd run holds for 3 × it).
	ttl = 2 * time.Second
)

// policy: alice and bob may read and lock under jobs/; carol may admin
// under jobs/ only; mallory has a certificate and no rule.
const policy = `
rules:
  - name: jobs
    principals: [alice, bob]
    prefixes: ["jobs/"]
    allow: [read, lock]
  - name: carol-jobs-admin
    principals: [carol]
    prefixes: ["jobs/"]
    allow: [admin]
`

var (
	buildOnce sync.Once
	lockdBin  string
	buildErr  error
)

// lockd returns the lockd binary: LOCKD_TEST_ABUSE_LOCKD, else cmd/lockd
// built once (with -race when the test has it).
func lockd(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("LOCKD_TEST_ABUSE_LOCKD"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lockd-abuse-bin-")
		if err != nil {
			buildErr = err
			return
		}
		lockdBin = filepath.Join(dir, "lockd")
		args := []string{"build", "-o", lockdBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "lock.dev/lockd/cmd/lockd")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return lockdBin
}

// pki is the suite's CA and the files of the server and of each principal.
type pki struct {
	dir, caFile, certFile, keyFile string
	ca                             *testkit.CA
	clients                        map[string][2]string // principal → cert, key files
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "abuse-ca")
	p := &pki{dir: dir, ca: ca, caFile: ca.WriteCA(t, dir, "ca.pem"), clients: map[string][2]string{}}
	p.certFile, p.keyFile = ca.Issue(t, testkit.CertOptions{DNSNames: []string{"localhost"},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}}).Write(t, dir, "server")
	for _, name := range []string{"alice", "bob", "carol", "mallory"} {
		c, k := ca.Issue(t, testkit.CertOptions{CommonName: name}).Write(t, dir, name)
		p.clients[name] = [2]string{c, k}
	}
	return p
}

// tlsConfig is the client TLS of principal.
func (p *pki) tlsConfig(t *testing.T, principal string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.clients[principal][0], p.clients[principal][1])
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: p.ca.Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// server is a running `lockd serve`.
type server struct {
	cmd                 *exec.Cmd
	grpc, http, metrics string
	stderr              string // path of its stderr
	exited              chan struct{}
	pki                 *pki
	by                  *bystander // bob's session held through the floods (baseline)
}

// serve starts lockd serve with mTLS and the policy on loopback, extra
// flags appended, and waits for its ready line.
func serve(t *testing.T, p *pki, extra ...string) *server {
	t.Helper()
	pf := filepath.Join(p.dir, "policy.yaml")
	if err := os.WriteFile(pf, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--session-ttl", ttl.String(), "--safety-margin", "500ms",
		"--tls-cert-file", p.certFile, "--tls-key-file", p.keyFile, "--tls-client-ca-file", p.caFile,
		"--auth-policy-file", pf}, extra...)
	s, line := start(t, args)
	s.pki = p
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "grpc":
			s.grpc = v
		case "http":
			s.http = v
		case "metrics":
			s.metrics = v
		}
	}
	return s
}

// start runs lockd with args and waits for its first stdout line (""
// when it exited first).
func start(t *testing.T, args []string) (*server, string) {
	t.Helper()
	errf, err := os.CreateTemp(t.TempDir(), "lockd-*.stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	cmd := exec.Command(lockd(t), args...)
	cmd.Env = testkit.ChildEnv([]string{"LOCKD_"})
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, stderr: errf.Name(), exited: make(chan struct{})}
	lines := make(chan string, 1)
	go func() { // exits when the process closes its stdout (it exited)
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			if first {
				lines <- sc.Text()
				first = false
			}
		}
		close(lines)
	}()
	go func() { // exits when the process has exited
		_ = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-s.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(s.stderr)
			t.Logf("lockd serve stderr (last 4 KiB):\n%s", tail(b, 4096))
		}
	})
	select {
	case l, ok := <-lines:
		if !ok {
			<-s.exited
		}
		return s, l
	case <-time.After(startTimeout):
		t.Fatalf("lockd %v printed no ready line within %v", args, startTimeout)
	}
	return nil, ""
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// result is a finished client command.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %s\nstderr: %s", r.code, r.took, r.stdout, r.stderr)
}

// client runs a lockd client command as principal (its certificate)
// against s.
func (s *server) client(t *testing.T, principal string, args ...string) result {
	t.Helper()
	flags := []string{"--server", s.grpc, "--tls-ca", s.pki.caFile,
		"--tls-cert", s.pki.clients[principal][0], "--tls-key", s.pki.clients[principal][1]}
	// Flags follow the command word (and precede "--" for run).
	full := append([]string{args[0]}, flags...)
	full = append(full, args[1:]...)
	return run(t, full...)
}

// run runs lockd with args.
func run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, lockd(t), args...)
	cmd.Env = testkit.ChildEnv([]string{"LOCKD_"})
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	began := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), took: time.Since(began)}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("lockd %v: %v", args, err)
	}
	return r
}

// dial opens a gRPC connection to s as principal.
func (s *server) dial(t *testing.T, principal string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(s.pki.tlsConfig(t, principal))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// stderrLines returns the server's stderr so far, one string per line.
func (s *server) stderrLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(s.stderr)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// p50Slack is what a flood may add to bob's acquire p50 on top of twice the
// unloaded one without the server treating bob worse (issue 23's "within 2 ×
// the unloaded value", asserted so that it holds on 2 loaded cores). The
// Linux scheduler (CFS) gives every runnable thread a turn within one
// scheduling period, sched_latency = 6 ms × (1 + log2(CPUs)) = 12 ms on 2
// CPUs; one round trip wakes two threads that the unloaded measurement found
// idle CPUs for — the server's handler and bob's reader — and each may
// wait up to one period behind the flood's runnable threads (the attacker's
// goroutines, the race detector's). So the flood may add up to 2 × 12 ms to
// a round trip that is served no later in the server's own order. The p50
// of 21 round trips ignores a few preemptions longer than that.
const p50Slack = 2 * 12 * time.Millisecond

// duringFlood checks issue 23's "Done when" while an attacker floods s: bob's
// `lockd run` is granted, holds its lock for 3 × TTL and exits 0, his
// acquire p50 (measured now) is within 2 × unloaded + p50Slack, and nothing
// of bob's is lost: the bystander session baseline opened before the flood
// still holds its lock (bystander.check). A flood that can be switched off
// and on again checks its p50 with pairedP50 instead (holdDuringFlood).
func duringFlood(t *testing.T, ctx context.Context, s *server, unloaded time.Duration, flood string) {
	t.Helper()
	holdDuringFlood(t, ctx, s, flood)
	loaded := acquireP50(t, ctx, s)
	t.Logf("bob's acquire p50: %v unloaded, %v while %s (bound %v)", unloaded, loaded, flood, 2*unloaded+p50Slack)
	if loaded > 2*unloaded+p50Slack {
		t.Errorf("bob's acquire p50 %v while %s; want at most 2 × %v + %v", loaded, flood, unloaded, p50Slack)
	}
}

// holdDuringFlood is duringFlood without the p50: bob's `lockd run` holds
// 3 × TTL and exits 0 while the flood lasts, and the bystander lost nothing.
func holdDuringFlood(t *testing.T, ctx context.Context, s *server, flood string) {
	t.Helper()
	if s.by != nil {
		defer s.by.check(t, ctx, s, flood, t.Errorf)
	}
	r := holdRun(t, s)
	if r.code != 0 {
		t.Errorf("bob's lockd run while %s: %v; want granted, held 3 × TTL, exit 0", flood, r)
	} else if r.took < 3*ttl {
		t.Errorf("bob's lockd run exited 0 after %v while %s; want it to have held its lock %v", r.took, flood, 3*ttl)
	}
}

// pairedRounds is how many (unloaded, loaded) pairs pairedP50 measures.
const pairedRounds = 5

// pairedP50 measures bob's acquire p50 in pairedRounds pairs, each an
// unloaded measurement (flood off) next to a loaded one (flood on), the
// order alternating (off on | on off | off on …) so that neither side is
// always the later one, and checks the pairs with p50PairsWithin. A single
// unloaded p50 taken before the flood compares two moments of a shared
// machine: in the clean-clone run r10 (load 14–26) it was 4.1 ms at a quiet
// moment and the idle flood's 32.3 ms at a loaded one (issue 21). Paired
// rounds a few hundred milliseconds apart see the same machine load, so
// what is left between them is what the flood itself adds, which
// p50Slack bounds. on switches the flood on (it may poll until the server
// has freed what off gave back); the flood is on when pairedP50 returns.
func pairedP50(t *testing.T, ctx context.Context, s *server, flood string, on, off func()) {
	t.Helper()
	var unloaded, loaded []time.Duration
	for i := range pairedRounds {
		if i%2 == 0 { // the flood is off
			unloaded = append(unloaded, acquireP50(t, ctx, s))
			on()
			loaded = append(loaded, acquireP50(t, ctx, s))
		} else {
			loaded = append(loaded, acquireP50(t, ctx, s))
			off()
			unloaded = append(unloaded, acquireP50(t, ctx, s))
		}
	}
	if pairedRounds%2 == 0 {
		on()
	}
	excess, ok := p50PairsWithin(unloaded, loaded)
	t.Logf("bob's acquire p50 in paired rounds while %s: unloaded %v, loaded %v; median excess over 2 × unloaded %v (bound %v)",
		flood, unloaded, loaded, excess, p50Slack)
	if !ok {
		t.Errorf("bob's acquire p50 while %s: median over %d paired rounds of loaded − 2 × unloaded = %v (unloaded %v, loaded %v); want at most %v",
			flood, len(unloaded), excess, unloaded, loaded, p50Slack)
	}
}

// p50PairsWithin is the bound of duringFlood (loaded ≤ 2 × unloaded +
// p50Slack) over paired rounds: the median of loaded[i] − 2 × unloaded[i]
// must be at most p50Slack. The median lets fewer than half of the pairs
// straddle a change of the machine's load.
func p50PairsWithin(unloaded, loaded []time.Duration) (time.Duration, bool) {
	excess := make([]time.Duration, len(unloaded))
	for i := range unloaded {
		excess[i] = loaded[i] - 2*unloaded[i]
	}
	slices.Sort(excess)
	m := excess[len(excess)/2]
	return m, m <= p50Slack
}

// baseline measures bob's unloaded acquire p50 before a flood and opens the
// bystander (openBystander).
func baseline(t *testing.T, ctx context.Context, s *server) time.Duration {
	t.Helper()
	unloaded := acquireP50(t, ctx, s)
	openBystander(t, ctx, s)
	return unloaded
}

// openBystander opens the bystander: a session of bob's holding
// jobs/bystander from before the flood to after it, which duringFlood
// checks.
func openBystander(t *testing.T, ctx context.Context, s *server) {
	t.Helper()
	c, err := client.New(s.grpc, client.WithTLS(s.pki.tlsConfig(t, "bob")))
	if err != nil {
		t.Fatal(err)
	}
	by := &bystander{c: c}
	t.Cleanup(func() { // before the server's cleanup (LIFO); bounded: the server may be gone
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if by.sess != nil {
			_ = by.sess.Close(cctx)
		}
		_ = c.Close()
	})
	if by.sess, err = c.NewSession(ctx, client.WithOwner("bob-bystander", nil)); err != nil {
		t.Fatalf("bob's bystander session: %v", err)
	}
	if by.lock, err = by.sess.TryAcquire(ctx, bystanderKey); err != nil {
		t.Fatalf("bob's bystander TryAcquire %s: %v", bystanderKey, err)
	}
	s.by = by
}

// bystanderKey is the key bob's bystander session holds through a flood.
const bystanderKey = "jobs/bystander"

// bystander is bob's session that holds bystanderKey through the floods.
type bystander struct {
	c    *client.Client
	sess *client.Session
	lock *client.Lock
}

// check asserts that nothing of bob's was lost during the flood (issue 23's
// "nothing is lost"): the bystander session and its lock are still trusted
// by the SDK (no session-lost or lock-lost), the server still has the key
// granted to that session with the same token, and the server logged no
// session_lost for it and no lock_released, lock_revoked for any key of
// bob's (the bystander's, his lockd run's, his latency probe's) other than
// his own releases and closes. It reports through errorf (t.Errorf; the
// control in TestF2F4StreamsAndWatches records instead).
func (b *bystander) check(t *testing.T, ctx context.Context, s *server, flood string, errorf func(string, ...any)) {
	t.Helper()
	if err := b.sess.Err(); err != nil {
		errorf("bob's bystander session was lost while %s: %v", flood, err)
	}
	if err := b.lock.Err(); err != nil {
		errorf("bob's bystander lock %s was lost while %s: %v", bystanderKey, flood, err)
	}
	info, err := b.c.Inspect(ctx, bystanderKey)
	if err != nil {
		errorf("bob's Inspect %s after %s: %v", bystanderKey, flood, err)
	} else if !info.Held || info.Session != b.sess.ID() || info.Token != b.lock.Token() {
		errorf("%s after %s: %+v; want held by bob's bystander session %s with token %d", bystanderKey, flood, info, b.sess.ID(), b.lock.Token())
	}
	bobs := func(key string) bool {
		return key == bystanderKey || key == "jobs/bob" || key == "jobs/latency"
	}
	for _, line := range s.stderrLines(t) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		key, _ := rec["key"].(string)
		switch rec["msg"] {
		case "session_lost":
			if rec["session"] == b.sess.ID() {
				errorf("bob's bystander session lost while %s: %s", flood, line)
			}
		case "lock_released":
			if r := rec["reason"]; bobs(key) && r != "release" && r != "session_closed" {
				errorf("bob's lock lost while %s: %s", flood, line)
			}
		case "lock_revoked":
			if bobs(key) {
				errorf("bob's lock revoked while %s: %s", flood, line)
			}
		}
	}
}
