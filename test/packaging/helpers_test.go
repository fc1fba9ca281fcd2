package packaging

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the lockd checkout this module lives in.
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

// Stamped into the test's release build.
const (
	stampVersion  = "v0.0.0-packaging"
	stampCommit   = "0123456789abcdef0123456789abcdef01234567"
	stampModified = "false"
)

var (
	lockdOnce sync.Once
	lockdPath string
	lockdErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	var err error
	binDir, err = os.MkdirTemp("", "lockd-packaging-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// releaseLDFlags are make release's -ldflags with the test's stamps.
func releaseLDFlags() string {
	const pkg = "lock.dev/lockd/internal/cli"
	return fmt.Sprintf("-s -w -X %s.version=%s -X %s.commit=%s -X %s.modified=%s",
		pkg, stampVersion, pkg, stampCommit, pkg, stampModified)
}

// lockdBinary builds lockd for the host once, with the release flags of
// the Makefile (CGO_ENABLED=0 -trimpath -ldflags "-s -w -X ...").
func lockdBinary(t *testing.T) string {
	t.Helper()
	lockdOnce.Do(func() {
		lockdPath = filepath.Join(binDir, "lockd")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", releaseLDFlags(), "-o", lockdPath, "./cmd/lockd")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			lockdErr = fmt.Errorf("go build ./cmd/lockd: %v\n%s", err, out)
		}
	})
	if lockdErr != nil {
		t.Fatal(lockdErr)
	}
	return lockdPath
}

// run runs a command to completion and returns its combined output.
func run(t *testing.T, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// lockdEnv is a clean environment for a lockd child: PATH and HOME only
// (no LOCKD_* of the test's own), plus extra.
func lockdEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, extra...)
}

var servingLine = regexp.MustCompile(`^lockd serving grpc=(\S+) metrics=(\S+) backend=(\S+)(?: http=(\S+))?$`)

// served is a running lockd serve.
type served struct {
	cmd                   *exec.Cmd
	grpc, metrics, backnd string
	http                  string // the HTTP/JSON API's address, "" when off
	stderr                *syncWriter
	done                  chan error
}

// serve starts the built lockd with args and env and waits for its serving
// line; cleanup stops it with SIGTERM and checks it exits 0.
func serve(t *testing.T, env []string, args ...string) *served {
	t.Helper()
	cmd := exec.Command(lockdBinary(t), args...)
	cmd.Env = env
	s := &served{cmd: cmd, stderr: &syncWriter{}, done: make(chan error, 1)}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() { // ends at the process's exit (stdout closes)
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("lockd %s after SIGTERM: %v\nstderr:\n%s", strings.Join(args, " "), err, s.stderr)
			}
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("lockd %s still running 60s after SIGTERM", strings.Join(args, " "))
		}
	})
	select {
	case line, ok := <-lines:
		m := servingLine.FindStringSubmatch(line)
		if !ok || m == nil {
			_ = cmd.Process.Kill()
			t.Fatalf("lockd %s printed %q, want %q\nstderr:\n%s", strings.Join(args, " "), line, servingLine, s.stderr)
		}
		s.grpc, s.metrics, s.backnd, s.http = m[1], m[2], m[3], m[4]
	case <-time.After(2 * time.Minute):
		t.Fatalf("lockd %s: no serving line within 2m\nstderr:\n%s", strings.Join(args, " "), s.stderr)
	}
	return s
}

// syncWriter is a bytes.Buffer written by a child's output copier and read
// by the test.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tlsFiles writes a CA (ca.crt) and a server certificate for 127.0.0.1
// and localhost (tls.crt, tls.key) into dir: the layout of a Kubernetes
// TLS secret with its CA.
func tlsFiles(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "packaging-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "lockd"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// localize rewrites an environment meant for a container or a host
// (absolute paths, 0.0.0.0 listeners) for a lockd child of this test:
// every old path prefix to its new one, every listener to 127.0.0.1:0.
func localize(env []string, paths map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		for old, repl := range paths {
			if strings.HasPrefix(v, old) {
				v = repl + strings.TrimPrefix(v, old)
			}
		}
		if (k == "LOCKD_SERVER_LISTEN" || k == "LOCKD_SERVER_METRICS_LISTEN" || k == "LOCKD_SERVER_HTTP_LISTEN") && v != "" && v != "off" {
			v = "127.0.0.1:0"
		}
		out = append(out, k+"="+v)
	}
	return out
}

// setEnv returns env with name set to value (replaced or appended).
func setEnv(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != name {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}
