package parity

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// An SDK agent: another language's SDK driven over JSON lines on its
// stdin/stdout (the protocol is in sdk/python/lockd/_agent.py). The
// scenarios of sdkScenarios run through it and must report the outcome
// strings the Go SDK reports in TestParity.

// python is Debian's interpreter, which has python3-grpcio and
// python3-protobuf.
const python = "/usr/bin/python3"

// reply is one reply or notice of the agent.
type reply map[string]any

// err is the reply's error name ("ok" for success): the Go SDK's sentinel
// names (ErrLocked, ErrWaitTimeout, ...).
func (r reply) err() string {
	if ok, _ := r["ok"].(bool); ok {
		return "ok"
	}
	if e, _ := r["error"].(string); e != "" {
		return e
	}
	return fmt.Sprintf("bad-reply(%v)", map[string]any(r))
}

func (r reply) str(k string) string { s, _ := r[k].(string); return s }

// at is when the reply arrived.
func (r reply) at() time.Time { t, _ := r["_at"].(time.Time); return t }

// seq is the reply's place among the agent's lines: the agent writes a
// notice and a reply in the order their events happened in it.
func (r reply) seq() int { n, _ := r["_seq"].(int); return n }

func (r reply) num(k string) uint64 {
	n, _ := r[k].(json.Number)
	v, _ := n.Int64()
	return uint64(v)
}

func (r reply) list(k string) []string {
	var out []string
	xs, _ := r[k].([]any)
	for _, x := range xs {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// agent is a running agent process.
type agent struct {
	t      *testing.T
	in     io.WriteCloser
	mu     sync.Mutex
	next   int
	wait   map[int]chan reply
	events chan reply
	// backlog holds notices read but not matched yet (event; the test's
	// goroutine only).
	backlog []reply
	stderr  lockedBuffer
	cmd     *exec.Cmd
	killed  atomic.Bool
}

// kill SIGKILLs the agent: a holder process that dies without a word.
func (a *agent) kill() {
	a.t.Helper()
	a.killed.Store(true)
	if err := a.cmd.Process.Kill(); err != nil {
		a.t.Fatalf("kill the agent: %v", err)
	}
}

// lockedBuffer is a bytes.Buffer safe for the agent's stderr copier and
// the test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPythonAgent starts the Python SDK's agent; it quits when t ends.
func startPythonAgent(t *testing.T) *agent {
	t.Helper()
	cmd := exec.Command(python, "-m", "lockd._agent")
	cmd.Dir = filepath.Join("..", "..", "sdk", "python")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	return startAgent(t, cmd)
}

// startAgent starts an SDK's agent command; it quits when t ends.
func startAgent(t *testing.T, cmd *exec.Cmd) *agent {
	t.Helper()
	a := &agent{t: t, wait: map[int]chan reply{}, events: make(chan reply, 1024), cmd: cmd}
	cmd.Stderr = &a.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the agent %s: %v", cmd.Path, err)
	}
	a.in = in
	read := make(chan struct{})
	go func() { // exits when the agent's stdout closes (it exited)
		defer close(read)
		seq := 0
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
			d.UseNumber()
			var r reply
			at := time.Now()
			if err := d.Decode(&r); err != nil {
				t.Errorf("agent: bad line %q: %v", sc.Text(), err)
				continue
			}
			r["_at"] = at // when the reply arrived
			seq++
			r["_seq"] = seq // the order of the agent's lines
			if id := r.num("id"); id != 0 {
				a.mu.Lock()
				ch := a.wait[int(id)]
				delete(a.wait, int(id))
				a.mu.Unlock()
				if ch != nil {
					ch <- r
				}
				continue
			}
			select {
			case a.events <- r:
			default:
				t.Errorf("agent: notice dropped (nobody reads): %v", map[string]any(r))
			}
		}
	}()
	t.Cleanup(func() {
		_ = json.NewEncoder(in).Encode(map[string]any{"id": -1, "op": "quit"})
		_ = in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }() // exits when the agent exits
		select {
		case err := <-done:
			if err != nil && !a.killed.Load() {
				t.Errorf("agent exit: %v\n%s", err, a.stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("agent did not quit within 30s\n%s", a.stderr.String())
		}
		<-read
	})
	return a
}

// start sends a request and returns its id and where its reply will come;
// it fails the test when the write fails, so only the test's goroutine may
// call it (others call send).
func (a *agent) start(op string, args map[string]any) (int, <-chan reply) {
	a.t.Helper()
	id, ch, err := a.send(op, args)
	if err != nil {
		a.t.Fatalf("agent %s: %v", op, err)
	}
	return id, ch
}

// send is start that returns the write's error instead of failing the test:
// for goroutines other than the test's.
func (a *agent) send(op string, args map[string]any) (int, <-chan reply, error) {
	a.mu.Lock()
	a.next++
	id := a.next
	ch := make(chan reply, 1)
	a.wait[id] = ch
	req := map[string]any{"id": id, "op": op}
	for k, v := range args {
		req[k] = v
	}
	b, err := json.Marshal(req)
	if err == nil {
		_, err = a.in.Write(append(b, '\n'))
	}
	if err != nil {
		delete(a.wait, id) // no reply will come
	}
	a.mu.Unlock()
	if err != nil {
		return 0, nil, fmt.Errorf("write %s: %w", op, err)
	}
	return id, ch, nil
}

// call sends a request and waits for its reply.
func (a *agent) call(op string, args map[string]any) reply {
	a.t.Helper()
	_, ch := a.start(op, args)
	return a.await(ch, op)
}

func (a *agent) await(ch <-chan reply, what string) reply {
	a.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(scenarioTimeout):
		a.t.Fatalf("agent: no reply to %s within %v\n%s", what, scenarioTimeout, a.stderr.String())
	}
	return nil
}

// must is call that fails the test unless the reply is a success.
func (a *agent) must(op string, args map[string]any) reply {
	a.t.Helper()
	r := a.call(op, args)
	if r.err() != "ok" {
		a.t.Fatalf("agent %s %v: %s %s", op, args, r.err(), r.str("message"))
	}
	return r
}

// event waits for the next notice that matches; notices that do not match
// are kept for later calls, in order.
func (a *agent) event(what string, match func(reply) bool) reply {
	a.t.Helper()
	for i, r := range a.backlog {
		if match(r) {
			a.backlog = append(a.backlog[:i], a.backlog[i+1:]...)
			return r
		}
	}
	deadline := time.After(scenarioTimeout)
	for {
		select {
		case r := <-a.events:
			if match(r) {
				return r
			}
			a.backlog = append(a.backlog, r)
		case <-deadline:
			a.t.Fatalf("agent: no %s within %v", what, scenarioTimeout)
			return nil
		}
	}
}

// agentTTL is the TTL of the agents' sessions that no scenario lets die:
// lockd's default session TTL (C5), not the suite's 3 s (ttl). A session
// stays trusted only while some heartbeat answer arrives within TTL −
// margin of its send, so at 3 s an agent process (or its lockd, or the
// database) stalled for 2.5 s loses a session the scenario never meant to
// lose: clean-clone run r10 (load 14–26, issue 21) lost the fifo-3-clients
// holder's session on its first acquire ("ErrSessionExpired session expired
// (deadline passed without acknowledgement)"), while at load 7–10 the
// scenario's sessions kept at least 2.1 s of their 2.5 s (docs/reliability.md
// "CI time", the fourth session). At 15 s a session rides out a stall of about 15 − 5 (the
// heartbeat interval, TTL/3) − 0.5 (the margin) = 9.5 s, beyond the suite's
// slack (6 s) for a loaded machine; TestAgentSessionOutlivesStall pauses an
// agent 3 s and shows both. Sessions a scenario lets die (a SIGKILLed
// holder, a holder whose lockd dies) ask for ttl: their waiters' bounds
// are ttl + slack.
const agentTTL = 15 * time.Second

// session opens a client of addr and a session in it; it returns the
// session's handle and id. The session's TTL is agentTTL unless args give
// one ("ttl", seconds).
func (a *agent) session(addr string, args map[string]any) (handle, id string) {
	a.t.Helper()
	c := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	if args == nil {
		args = map[string]any{}
	}
	if _, ok := args["ttl"]; !ok {
		args["ttl"] = agentTTL.Seconds()
	}
	args["client"] = c
	r := a.must("session", args)
	return r.str("session"), r.str("session_id")
}

// holderOf is helpers_test.go's holder for an agent's inspect or revoke
// reply: free, held(A), held(A) waiters=[B C].
func holderOf(r reply, names map[string]string) string {
	if r.err() != "ok" {
		return "error(" + r.err() + ")"
	}
	if held, _ := r["held"].(bool); !held {
		return "free"
	}
	label := func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return "other"
	}
	out := "held(" + label(r.str("session")) + ")"
	if ws := r.list("waiters"); len(ws) > 0 {
		for i, w := range ws {
			ws[i] = label(w)
		}
		out += " waiters=[" + strings.Join(ws, " ") + "]"
	}
	return out
}

// waitQueuedAgent polls the agent's inspect until key has n waiters.
func waitQueuedAgent(t *testing.T, a *agent, c, key string, n int) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d waiter(s) queued for %q", n, key), func() bool {
		r := a.call("inspect", map[string]any{"client": c, "key": key})
		return r.err() == "ok" && len(r.list("waiters")) == n
	})
}
