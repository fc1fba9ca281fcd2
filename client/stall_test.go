package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/cli"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// replicaEnv, when set, makes the test binary a lockd replica (see
// TestMain): it runs `lockd serve` with the arguments in it, one per line,
// until SIGTERM. A replica must be a process of its own to be stopped with
// SIGSTOP. (Not LOCKD_…: lockd would read it as configuration.)
const replicaEnv = "CLIENT_TEST_REPLICA_ARGS"

// runReplica is the replica process: lockd serve, as cmd/lockd runs it.
func runReplica(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return cli.Run(ctx, args, os.Stdin, os.Stdout, os.Stderr)
}

// Replica timing: the TTL and margin of lockdtest. The progress interval
// of Watch is the advertised heartbeat interval, TTL/3 (C2
// #ct2-watch-progress), so the SDK's silence bound is three of it, 3 s.
const (
	replicaTTL      = 3 * time.Second
	replicaProgress = replicaTTL / 3
	silenceBound    = 3 * replicaProgress
)

// replica is a lockd child process.
type replica struct {
	cmd     *exec.Cmd
	addr    string // gRPC
	metrics string // /metrics
	stderr  *testkit.LogBuffer
}

var servingLine = regexp.MustCompile(`^lockd serving grpc=(\S+) metrics=(\S+) `)

// startReplica starts a lockd replica over the backend namespace that
// backendArgs and env name; the test's cleanup kills it (also when it is
// stopped) and shows its log if the test failed.
func startReplica(t *testing.T, name string, backendArgs, env []string) *replica {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--session-ttl", replicaTTL.String(), "--safety-margin", "500ms", "--drain-timeout", "0"}, backendArgs...)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = testkit.ChildEnv([]string{"LOCKD_", replicaEnv + "="}, append(env, replicaEnv+"="+strings.Join(args, "\n"))...)
	r := &replica{cmd: cmd, stderr: &testkit.LogBuffer{}}
	cmd.Stderr = r.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start replica %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("replica %s stderr:\n%s", name, r.stderr)
		}
	})
	line := make(chan string, 1)
	go func() { // ends when the process's stdout closes (it exits)
		sc := bufio.NewScanner(out)
		for first := true; sc.Scan(); first = false {
			if first {
				line <- sc.Text()
			}
		}
		close(line)
	}()
	select {
	case l := <-line:
		m := servingLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("replica %s printed %q; want %q", name, l, servingLine)
		}
		r.addr, r.metrics = m[1], m[2]
	case <-time.After(time.Minute):
		t.Fatalf("replica %s: no serving line within a minute; stderr:\n%s", name, r.stderr)
	}
	return r
}

// watchesOpened is the replica's count of backend watches opened
// (lockd_backend_request_seconds{op="watch"}, C4): its own lock-loss watch
// and one per Watch stream it serves.
func (r *replica) watchesOpened(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	m := regexp.MustCompile(`(?m)^lockd_backend_request_seconds_count\{[^}]*op="watch"[^}]*\} (\d+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// replicaBackend returns the serve flags and environment of a fresh
// namespace on backend, shared by every replica started with them.
func replicaBackend(t *testing.T, kind string) (args, env []string) {
	t.Helper()
	switch kind {
	case backend.Etcd:
		return []string{"--backend", "etcd", "--etcd-endpoints", strings.Join(etcdtest.Endpoints(t), ","),
			"--etcd-prefix", etcdtest.Prefix(t)}, nil
	case backend.PG:
		// The DSN in the environment, not in ps.
		return []string{"--backend", "pg"}, []string{"LOCKD_PG_DSN=" + pgtest.NewDatabase(t)}
	}
	t.Fatalf("unknown backend %q", kind)
	return nil, nil
}

// nextEvent returns the watch's next event, or fails if none comes before
// deadline.
func nextEvent(t *testing.T, events <-chan client.Event, deadline time.Time, what string) client.Event {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatalf("%s: the watch ended", what)
		}
		if ev.Err != nil {
			t.Fatalf("%s: the watch broke: %v", what, ev.Err)
		}
		return ev
	case <-time.After(time.Until(deadline)):
		t.Fatalf("%s: no event by the deadline", what)
	}
	return client.Event{}
}

// TestWatchMovesFromStalledReplica (issue #21 §2, C2 #ct2-watch-progress):
// a client that only watches (no session: no KeepAlive stream) is
// connected to replica A of two; A is stopped with SIGSTOP (its
// connections stay open, nothing answers). An event committed through B
// after the stall reaches the watcher within the silence bound (three
// progress intervals) plus the time to open a stream on B: the SDK found
// the stream silent, set A aside and resumed through B from its last
// cursor — on etcd with exactly the events after it, on PostgreSQL with a
// resync and then the events after the move. Before progress messages the
// watch stayed on A, silent, forever.
func TestWatchMovesFromStalledReplica(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		args, env := replicaBackend(t, kind)
		a := startReplica(t, "A", args, env)
		b := startReplica(t, "B", args, env)
		ctx := testCtx(t, 2*time.Minute)

		// The watcher knows both replicas and connects to the first that
		// answers, A (pick_first); the writer knows only B.
		watcher, err := client.New(a.addr, client.WithAddresses(a.addr, b.addr), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = watcher.Close() })
		writer, err := client.New(b.addr, client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = writer.Close() })

		// Each replica opens one backend watch of its own (lock-loss
		// notices) once it serves; then the watcher's stream adds one on
		// the replica that serves it.
		var aBefore, bBefore int
		testkit.Eventually(t, 30*time.Second, "both replicas' own backend watch", func() bool {
			aBefore, bBefore = a.watchesOpened(t), b.watchesOpened(t)
			return aBefore > 0 && bBefore > 0
		})
		events, err := watcher.Watch(ctx, "stall/")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		testkit.Eventually(t, 10*time.Second, "the watch served by A", func() error {
			if na, nb := a.watchesOpened(t), b.watchesOpened(t); na != aBefore+1 || nb != bBefore {
				return fmt.Errorf("backend watches opened: A %d→%d, B %d→%d; want A +1, B +0", aBefore, na, bBefore, nb)
			}
			return nil
		})
		// The writer's session is only a vehicle (longTTL).
		s, err := writer.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		before, err := s.Acquire(ctx, "stall/before")
		if err != nil {
			t.Fatalf("Acquire(stall/before): %v", err)
		}
		if ev := nextEvent(t, events, time.Now().Add(30*time.Second), "before the stall"); ev.Kind != client.EventAcquired || ev.Key != "stall/before" {
			t.Fatalf("before the stall: %v %s; want acquired stall/before", ev.Kind, ev.Key)
		}

		// Every thread of A stopped before stall/before is released: kill(2)
		// returns before the process stops, and a replica still running
		// then delivers the release itself (issue 21: "first event
		// released stall/before 94ms after SIGSTOP; want a resync").
		testkit.Stop(t, a.cmd.Process, 30*time.Second)
		stalled := time.Now()
		if err := before.Release(ctx); err != nil {
			t.Fatalf("Release(stall/before) through B: %v", err)
		}
		after, err := s.Acquire(ctx, "stall/after")
		if err != nil {
			t.Fatalf("Acquire(stall/after) through B: %v", err)
		}
		// The stream went silent at the latest when A stopped, so the SDK
		// gives up on it within the silence bound of that; opening a
		// stream on B (a loopback connection, a backend watch, the replay)
		// takes well under a second even on a loaded two-core machine
		// under -race: one more silence bound is ample.
		deadline := stalled.Add(2 * silenceBound)
		first := nextEvent(t, events, deadline, "after the stall")
		t.Logf("%s: first event %v %s %v after SIGSTOP", kind, first.Kind, first.Key, time.Since(stalled).Round(time.Millisecond))
		switch kind {
		case backend.Etcd:
			// Resumed from the cursor of stall/before's acquired event:
			// exactly what came after it.
			second := nextEvent(t, events, deadline.Add(10*time.Second), "the second event after the stall")
			if first.Kind != client.EventReleased || first.Key != "stall/before" || first.Token != before.Token() ||
				second.Kind != client.EventAcquired || second.Key != "stall/after" || second.Token != after.Token() {
				t.Fatalf("etcd: after the stall %v %s #%d, %v %s #%d; want released stall/before #%d, acquired stall/after #%d",
					first.Kind, first.Key, first.Token, second.Kind, second.Key, second.Token, before.Token(), after.Token())
			}
		case backend.PG:
			// No history to resume from: a resync, then what comes after.
			if first.Kind != client.EventResync {
				t.Fatalf("PostgreSQL: first event after the stall %v %s; want a resync", first.Kind, first.Key)
			}
			later, err := s.Acquire(ctx, "stall/later")
			if err != nil {
				t.Fatalf("Acquire(stall/later): %v", err)
			}
			if ev := nextEvent(t, events, time.Now().Add(30*time.Second), "after the resync"); ev.Kind != client.EventAcquired || ev.Key != "stall/later" || ev.Token != later.Token() {
				t.Fatalf("PostgreSQL: after the resync %v %s #%d; want acquired stall/later #%d", ev.Kind, ev.Key, ev.Token, later.Token())
			}
		}
	})
}
