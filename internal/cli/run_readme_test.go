package cli

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/lockdtest"
)

// readmeCronSection is the README section whose examples
// TestReadmeCronExamples runs.
const readmeCronSection = "## lockd in cron and systemd timers"

// codeBlock is a fenced code block of the README: its info string and lines.
type codeBlock struct {
	lang  string
	lines []string
}

// readmeBlocks returns the fenced code blocks of the README section that
// starts with heading.
func readmeBlocks(t *testing.T, heading string) []codeBlock {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	var blocks []codeBlock
	var cur *codeBlock
	sc := bufio.NewScanner(strings.NewReader(sec))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &codeBlock{lang: strings.TrimPrefix(line, "```")}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
	}
	if cur != nil {
		t.Fatalf("README section %q: unterminated code block", heading)
	}
	return blocks
}

// cronExample is one command of the README section, as cron or systemd
// would run it.
type cronExample struct {
	name    string
	argv    []string // lockd run ... KEY -- CMD...
	env     []string // NAME=value set for it (systemd Environment=)
	success []int    // exit statuses its scheduler counts as success
	quiet   bool     // a skipped run prints nothing (cron mails output)
}

// shSplit splits a command line as /bin/sh does (cron runs its commands
// with sh -c).
func shSplit(t *testing.T, line string) []string {
	t.Helper()
	out, err := exec.Command("sh", "-c", `set -- `+line+`; printf '%s\0' "$@"`).Output()
	if err != nil {
		t.Fatalf("sh could not split %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// cronLine is a crontab entry: five time fields, then the command.
var cronLine = regexp.MustCompile(`^\s*(\S+\s+){5}(.*)$`)

// parseCronExamples reads the README's crontab and systemd unit blocks.
func parseCronExamples(t *testing.T, blocks []codeBlock) []cronExample {
	t.Helper()
	var examples []cronExample
	services, timers := map[string]bool{}, map[string]bool{}
	for _, b := range blocks {
		switch b.lang {
		case "crontab":
			for _, line := range b.lines {
				if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue
				}
				m := cronLine.FindStringSubmatch(line)
				if m == nil {
					t.Fatalf("README crontab line %q: want five time fields and a command", line)
				}
				if strings.Contains(m[2], "%") {
					t.Fatalf("README crontab line %q: cron turns %% into a newline", line)
				}
				examples = append(examples, cronExample{name: "crontab", argv: shSplit(t, m[2]), success: []int{0}, quiet: true})
			}
		case "ini":
			if len(b.lines) == 0 || !strings.HasPrefix(b.lines[0], "# /etc/systemd/system/") {
				t.Fatalf("README unit block starts with %q, want its path as a comment", b.lines)
			}
			unit := path.Base(strings.TrimPrefix(b.lines[0], "# "))
			name, kind, _ := strings.Cut(unit, ".")
			ex := cronExample{name: unit, success: []int{0}}
			for _, line := range b.lines[1:] {
				k, v, ok := strings.Cut(line, "=")
				if !ok {
					continue
				}
				switch k {
				case "ExecStart":
					ex.argv = systemdSplit(t, v)
				case "Environment":
					ex.env = append(ex.env, v)
				case "SuccessExitStatus":
					for _, f := range strings.Fields(v) {
						n, err := strconv.Atoi(f)
						if err != nil {
							t.Fatalf("README %s: SuccessExitStatus %q: %v", unit, f, err)
						}
						ex.success = append(ex.success, n)
					}
				case "OnCalendar":
					timers[name] = true
				}
			}
			switch kind {
			case "service":
				if ex.argv == nil {
					t.Fatalf("README %s has no ExecStart=", unit)
				}
				services[name] = true
				examples = append(examples, ex)
			case "timer":
			default:
				t.Fatalf("README unit %s: want a .service or a .timer", unit)
			}
		default:
			t.Fatalf("README section %q: code block %q is not crontab or ini; teach TestReadmeCronExamples to run it", readmeCronSection, b.lang)
		}
	}
	for name := range services {
		if !timers[name] {
			t.Errorf("README: %s.service has no %[1]s.timer with OnCalendar=", name)
		}
	}
	return examples
}

// systemdSplit splits an ExecStart= command line. The examples keep to the
// part of systemd's syntax that is plain words plus the %H specifier.
func systemdSplit(t *testing.T, line string) []string {
	t.Helper()
	if strings.ContainsAny(line, `'"\$;`) {
		t.Fatalf("README ExecStart=%s: keep to plain words (quotes, $ and ; are not tested)", line)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields(line)
	for i, w := range words {
		w = strings.ReplaceAll(w, "%H", host)
		if strings.Contains(strings.ReplaceAll(w, "%%", ""), "%") {
			t.Fatalf("README ExecStart=%s: specifier in %q not known to the test", line, words[i])
		}
		words[i] = strings.ReplaceAll(w, "%%", "%")
	}
	return words
}

// TestReadmeCronExamples runs the commands of the README's "lockd in cron and
// systemd timers" section against a real server, exactly as written up to
// their "--": CMD (a site's own job) is replaced by a stand-in that records
// its run, and LOCKD_SERVER points at the test's server. Each example must
// run CMD when the key is free; skip it, with a status its scheduler counts
// as success (and no output for cron), when the key is held; and, if it
// sets --max-runtime, fail (124, not a success status) when CMD overruns.
func TestReadmeCronExamples(t *testing.T) {
	t.Parallel()
	examples := parseCronExamples(t, readmeBlocks(t, readmeCronSection))
	if len(examples) < 2 {
		t.Fatalf("README section %q: %d runnable examples, want a crontab line and a systemd service", readmeCronSection, len(examples))
	}
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			argv := ex.argv
			sep := slices.Index(argv, "--")
			if len(argv) < 4 || path.Base(argv[0]) != "lockd" || argv[1] != "run" || sep < 3 || sep == len(argv)-1 {
				t.Fatalf("example %q: want lockd run [FLAGS] KEY -- CMD", argv)
			}
			runArgs, key := argv[1:sep], argv[sep-1]
			var environ []string
			for _, kv := range ex.env {
				if !strings.HasPrefix(kv, EnvServer+"=") {
					environ = append(environ, kv)
				}
			}
			environ = append(environ, EnvServer+"="+srv.Addr, "PATH="+os.Getenv("PATH"))
			ranLog := tempFile(t, "ran")
			standIn := []string{"--", "sh", "-c", `echo "$LOCKD_KEY $LOCKD_FENCING_TOKEN" >> ` + ranLog}
			runs := func() int { return strings.Count(fileContent(t, ranLog), "\n") }

			// The key is free: CMD runs under it.
			res := lockd(t, environ, append(slices.Clone(runArgs), standIn...)...)
			if res.code != 0 || runs() != 1 || !strings.HasPrefix(fileContent(t, ranLog), key+" ") {
				t.Fatalf("example %q with %s free: %v\nCMD saw %q; want exit 0 and one run under the key", argv, key, res, fileContent(t, ranLog))
			}

			// The key is held (the previous run, or another host): skipped.
			l := hold(t, srv.Client, key)
			res = lockd(t, environ, append(slices.Clone(runArgs), standIn...)...)
			if !slices.Contains(ex.success, res.code) || runs() != 1 {
				t.Errorf("example %q with %s held: %v\nCMD runs %d; want no run and a status in %v", argv, key, res, runs(), ex.success)
			}
			if ex.quiet && (res.stdout != "" || res.stderr != "") {
				t.Errorf("example %q with %s held printed %q / %q, want nothing", argv, key, res.stdout, res.stderr)
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}

			// CMD overruns --max-runtime (the example's, shortened: a later
			// flag wins): stopped, and the scheduler sees a failure.
			if !slices.ContainsFunc(runArgs, func(a string) bool { return strings.HasPrefix(a, "--max-runtime") }) {
				return
			}
			short := append(slices.Clone(runArgs[:len(runArgs)-1]), "--max-runtime", "300ms", key, "--", "sleep", "60")
			res = lockd(t, environ, short...)
			if res.code != ExitMaxRuntime || slices.Contains(ex.success, res.code) {
				t.Errorf("example %q overrunning: %v\nwant exit %d, not a success status (%v)", argv, res, ExitMaxRuntime, ex.success)
			}
			if info, err := srv.Client.Inspect(context.Background(), key); err != nil || info.Held {
				t.Errorf("after the overrun: Inspect(%s) = %+v, %v; want released", key, info, err)
			}
		})
	}
}
