package cli

import (
	"context"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// readmeNetworkSection is the README section whose commands
// TestReadmeNetworkExamples runs.
const readmeNetworkSection = "## Running lockd on a network"

// netStep is one step of the README section, in document order: a shell
// block run as a whole by sh, or one lockd command line.
type netStep struct {
	script string   // a block without lockd commands, for sh -e
	argv   []string // a lockd command line (lockd ARGS...)
	export []string // NAME=value of an `export` line
}

// parseNetworkSteps reads the section's sh blocks. A block either holds
// no lockd command (it runs as a whole through sh: openssl, a heredoc) or
// holds only comments, `export NAME=VALUE` lines and `lockd ...` command
// lines, which the test runs itself (in-process, with addresses
// substituted); a trailing backslash continues a line.
func parseNetworkSteps(t *testing.T, blocks []codeBlock) []netStep {
	t.Helper()
	var steps []netStep
	for _, b := range blocks {
		if b.lang != "sh" {
			t.Fatalf("README section %q: code block %q is not sh; teach TestReadmeNetworkExamples to run it", readmeNetworkSection, b.lang)
		}
		var lines []string
		for i := 0; i < len(b.lines); i++ {
			line := b.lines[i]
			for strings.HasSuffix(line, `\`) && i+1 < len(b.lines) {
				i++
				line = strings.TrimSuffix(line, `\`) + b.lines[i]
			}
			lines = append(lines, line)
		}
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "lockd ") }) {
			steps = append(steps, netStep{script: strings.Join(b.lines, "\n") + "\n"})
			continue
		}
		for _, line := range lines {
			trimmed := strings.TrimSpace(line)
			switch {
			case trimmed == "" || strings.HasPrefix(trimmed, "#"):
			case strings.HasPrefix(trimmed, "export "):
				kv := shSplit(t, strings.TrimPrefix(trimmed, "export "))
				if len(kv) != 1 || !strings.Contains(kv[0], "=") {
					t.Fatalf("README line %q: want export NAME=VALUE", line)
				}
				steps = append(steps, netStep{export: kv})
			case strings.HasPrefix(trimmed, "lockd "):
				steps = append(steps, netStep{argv: shSplit(t, trimmed)})
			default:
				t.Fatalf("README line %q: a block with lockd commands may hold only comments, export lines and lockd commands", line)
			}
		}
	}
	return steps
}

// sh runs script with sh -e in the current directory.
func sh(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-e", "-c", script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README commands failed: %v\n%s\n%s", err, script, out)
	}
}

// clientPrincipal is the `name=` line of the README's client certificate
// block: the principal its certificate is made for.
var clientPrincipal = regexp.MustCompile(`(?m)^name=(\S+)$`)

// withoutTLSFlags drops the --tls-* client flags (and their values).
func withoutTLSFlags(argv []string) []string {
	var out []string
	for i := 0; i < len(argv); i++ {
		if strings.HasPrefix(argv[i], "--tls-") {
			if !strings.Contains(argv[i], "=") {
				i++
			}
			continue
		}
		out = append(out, argv[i])
	}
	return out
}

// replaceWords replaces whole arguments equal to old with repl.
func replaceWords(argv []string, old, repl string) []string {
	out := slices.Clone(argv)
	for i, a := range out {
		if a == old {
			out[i] = repl
		}
	}
	return out
}

// TestReadmeNetworkExamples runs the README's "Running lockd on a network"
// section in a temporary directory: the openssl and policy blocks through
// sh, exactly as written; `lockd auth check` as written; `lockd serve` as
// written except that its listen addresses become 127.0.0.1:0; the client
// commands as written, with LOCKD_SERVER pointing at that server and
// LOCKD_TLS_SERVER_NAME at the README's host name (the test's stand-in for
// DNS). It asserts that the policy check answers as the policy says, that
// the same serve command without its TLS flags is refused on the README's
// non-loopback address, that the README's principal runs its command and
// lists the key, and that a certificate of a principal the policy does not
// name (made with the README's own client certificate commands) and a
// plaintext client are refused without the command running.
func TestReadmeNetworkExamples(t *testing.T) {
	steps := parseNetworkSteps(t, readmeBlocks(t, readmeNetworkSection))
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("the README's certificates need openssl: %v", err)
	}
	t.Chdir(t.TempDir())

	environ := []string{"PATH=" + os.Getenv("PATH"), "LOCKD_EMBEDDED_DATA_DIR=" + t.TempDir()}
	var (
		principal, certScript string
		serverAddr            string
		runLine, lsLine       []string
	)
	for _, st := range steps {
		switch {
		case st.script != "":
			sh(t, st.script)
			if m := clientPrincipal.FindStringSubmatch(st.script); m != nil {
				principal, certScript = m[1], st.script
			}

		case st.export != nil:
			k, v, _ := strings.Cut(st.export[0], "=")
			if k != EnvServer {
				t.Fatalf("README exports %s; the test knows only %s", k, EnvServer)
			}
			if serverAddr == "" {
				t.Fatalf("README exports %s before lockd serve", EnvServer)
			}
			host, _, err := net.SplitHostPort(v)
			if err != nil {
				t.Fatalf("README %s=%s: %v", EnvServer, v, err)
			}
			environ = append(environ, EnvServer+"="+serverAddr, EnvTLSServerName+"="+host)

		case len(st.argv) >= 2 && st.argv[0] == "lockd" && st.argv[1] == "auth":
			if principal == "" {
				t.Fatal("README runs lockd auth check before the client certificate block (name=...)")
			}
			res := lockd(t, environ, st.argv[1:]...)
			p := st.argv[len(st.argv)-3]
			want, wantCode := "denied: ", ExitError
			if p == principal {
				want, wantCode = "allowed: ", ExitOK
			}
			if res.code != wantCode || !strings.HasPrefix(res.stdout, want) {
				t.Errorf("%q: %v\nwant exit %d and %q...", st.argv, res, wantCode, want)
			}

		case len(st.argv) >= 2 && st.argv[0] == "lockd" && st.argv[1] == "serve":
			serveServer(t, st.argv[1:], environ, &serverAddr)

		case len(st.argv) >= 2 && st.argv[0] == "lockd" && st.argv[1] == "run":
			runLine = st.argv[1:]
			res := lockd(t, environ, runLine...)
			if res.code != 0 || !regexp.MustCompile(`(?m)^token [1-9][0-9]*$`).MatchString(res.stdout) {
				t.Fatalf("%q as %s: %v\nwant exit 0 and the command's output with a fencing token", st.argv, principal, res)
			}

		case len(st.argv) >= 2 && st.argv[0] == "lockd" && st.argv[1] == "ls":
			lsLine = st.argv[1:]
			if res := lockd(t, environ, lsLine...); res.code != 0 {
				t.Fatalf("%q: %v\nwant exit 0", st.argv, res)
			}

		default:
			t.Fatalf("README command %q: the test does not know how to run it", st.argv)
		}
	}
	if serverAddr == "" || runLine == nil || lsLine == nil || certScript == "" {
		t.Fatalf("README section %q: want a client certificate block (name=...), lockd serve, lockd run and lockd ls", readmeNetworkSection)
	}

	// The README's ls lists a key held by the README's principal.
	key := runLine[slices.Index(runLine, "--")-1]
	cfg, err := client.TLSConfigFromFiles("ca.crt", principal+".crt", principal+".key", envValue(environ, EnvTLSServerName))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(serverAddr, client.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l := hold(t, c, key)
	if res := lockd(t, environ, lsLine...); res.code != 0 || !strings.Contains(res.stdout, key) {
		t.Errorf("%q with %s held: %v\nwant exit 0 and the key listed", lsLine, key, res)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Another principal, with a certificate of the same CA made by the
	// README's own commands: refused by the policy, the command not run.
	const stranger = "mallory"
	sh(t, strings.Replace(certScript, "name="+principal, "name="+stranger, 1))
	denied := replaceWords(replaceWords(runLine, principal+".crt", stranger+".crt"), principal+".key", stranger+".key")
	res := lockd(t, environ, denied...)
	if res.code == 0 || strings.Contains(res.stdout, "token") ||
		!strings.Contains(res.stderr, "access denied: "+stranger+" may not lock") {
		t.Errorf("%q as %s: %v\nwant the policy's refusal (access denied) and no run", denied, stranger, res)
	}

	// A plaintext client (no --tls-* flags, no LOCKD_TLS_*): refused.
	var plainEnv []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "LOCKD_TLS_") {
			plainEnv = append(plainEnv, kv)
		}
	}
	plain := append(withoutTLSFlags(runLine[:1]), "--timeout", "2s")
	plain = append(plain, withoutTLSFlags(runLine[1:])...)
	start := time.Now()
	res = lockd(t, plainEnv, plain...)
	if res.code == 0 || strings.Contains(res.stdout, "token") {
		t.Errorf("%q over plaintext: %v\nwant a failure and no run", plain, res)
	}
	t.Logf("plaintext client refused after %v: exit %d, %s", time.Since(start).Round(time.Millisecond), res.code, strings.TrimSpace(res.stderr))
}

// serveServer checks that the README's serve command names a
// non-loopback listen address, that it is refused there without its TLS
// flags, and starts it as written with its listen addresses on
// 127.0.0.1:0; it stores the gRPC address in addr.
func serveServer(t *testing.T, args, environ []string, addr *string) {
	t.Helper()
	i := slices.Index(args, "--listen")
	if i < 0 || i+1 == len(args) {
		t.Fatalf("README %q: want --listen ADDR", args)
	}
	host, _, err := net.SplitHostPort(args[i+1])
	if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsLoopback() {
		t.Fatalf("README %q: want a non-loopback --listen address", args)
	}
	var insecure []string
	for j := 0; j < len(args); j++ {
		if strings.HasPrefix(args[j], "--tls-") {
			j++
			continue
		}
		insecure = append(insecure, args[j])
	}
	if res := lockd(t, environ, insecure...); res.code == 0 || !strings.Contains(res.stderr, "lock.server.tls.cert-file") {
		t.Errorf("%q (no TLS, non-loopback): %v\nwant a refusal naming lock.server.tls.cert-file", insecure, res)
	}

	local := slices.Clone(args)
	for j, a := range local {
		if j > 0 && (local[j-1] == "--listen" || local[j-1] == "--metrics-listen") {
			local[j] = "127.0.0.1:0"
		} else if strings.HasPrefix(a, "-") && strings.Contains(a, "listen=") {
			t.Fatalf("README %q: write --listen ADDR, not --listen=ADDR", args)
		}
	}
	*addr, _, _ = start(t, environ, local...).serving(t)
}

// envValue returns the value of NAME in environ ("" if unset).
func envValue(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}
