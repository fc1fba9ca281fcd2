package runner

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/test/chaos/check"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// echoServer echoes every line on every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	wg.Add(1)
	go func() { // exits when the listener closes
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { // exits when the connection closes
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip writes a line and reads it back within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return errors.New("echo mismatch: " + got)
	}
	return nil
}

func TestProxyPartition(t *testing.T) {
	p, err := newProxy("test", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, "before", 5*time.Second); err != nil {
		t.Fatalf("through the proxy before the cut: %v", err)
	}
	if err := p.partition(); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if err := roundTrip(c, r, "during", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("round trip during the cut: %v; want a timeout (bytes dropped, connection open)", err)
	}
	c2, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatalf("dial during the cut: %v; want the connection accepted and then silent", err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if err := roundTrip(c2, r2, "new", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("new connection during the cut: %v; want a timeout", err)
	}
	// Keep bytes flowing into both cut connections while healing: in
	// toxiproxy v2.12.0 removing the toxics at that moment leaks the links'
	// goroutines (proxy doc), which goleak in TestMain would report.
	var wg sync.WaitGroup
	for _, cc := range []net.Conn{c, c2} {
		wg.Add(1)
		go func() { // ends when the heal has closed the connection
			defer wg.Done()
			_ = cc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := io.WriteString(cc, "in flight\n"); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the writers get going
	if err := p.heal(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Healing closes the connections the cut held.
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("read on a cut connection after heal: %v; want it closed", err)
	}
	c3, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3, bufio.NewReader(c3), "after", 5*time.Second); err != nil {
		t.Errorf("through the proxy after heal: %v", err)
	}
}

func TestProcessLinesAndStop(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var got []string
	p, err := startProcess("sh", "/bin/sh", []string{"-c", "echo one; echo two; exec sleep 60"}, nil,
		filepath.Join(dir, "sh.log"), noAnswer(func(l string) {
			mu.Lock()
			got = append(got, l)
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if strings.Join(got, ",") != "one,two" {
		t.Errorf("lines = %q; want one, two", got)
	}
	mu.Unlock()
	if p.done() {
		t.Fatal("process exited early")
	}
	if killed := p.stop(10 * time.Second); killed {
		t.Error("sleep ignored SIGTERM; had to kill it")
	}
	if !p.done() || p.err() == nil {
		t.Errorf("after stop: done %v, err %v; want exited by a signal", p.done(), p.err())
	}
}

func TestVerdictAndTable(t *testing.T) {
	clean := func(spec Spec) *Report {
		return &Report{Spec: spec, Acquisitions: 10, Faults: 2,
			Fenced: check.Result{Checker: "fenced-safety"}, Overlapping: check.Result{Checker: "overlapping-writers"},
			Linearizable: check.Result{Checker: "linearizable"}, Trusted: check.Result{Checker: "no-trusted-overlap"},
			Tokens: check.Result{Checker: "tokens-increase"}, Liveness: check.LivenessResult{Result: check.Result{Checker: "liveness"}},
			Recovery: check.RecoveryResult{Result: check.Result{Checker: "recovery"}}, PauseHits: check.Result{Checker: "pauses-hit-holders"}}
	}
	pass := clean(Spec{Name: "pause-x", Backend: PG, Fault: PauseHolder})
	pass.Pauses, pass.Rejected = 2, 3
	unrefused := clean(Spec{Name: "unrefused", Backend: PG, Fault: PauseHolder})
	unrefused.Pauses, unrefused.Rejected = 2, 1
	missed := clean(Spec{Name: "missed", Backend: PG, Fault: ClockSkew})
	missed.Pauses, missed.Rejected = 2, 2
	missed.PauseHits.Violations = 1
	stuck := clean(Spec{Name: "stuck", Backend: Etcd, Fault: QuorumLoss})
	stuck.Recovery.Violations = 2
	pending := clean(Spec{Name: "pending", Backend: Embedded, Fault: RestartEmpty, Pending: "issue 11 §1"})
	pending.Tokens.Violations = 1
	noHeal := clean(Spec{Name: "no-heal", Backend: PG, Fault: PartitionShort, Control: NoHeal})
	noHeal.Recovery.Violations = 2
	blindNoHeal := clean(Spec{Name: "blind-no-heal", Backend: PG, Fault: PartitionShort, Control: NoHeal})
	noSync := clean(Spec{Name: "no-sync", Backend: EtcdCluster, Fault: MemberReplace, Control: NoSync})
	noSync.Recovery.Violations = 2
	blindNoSync := clean(Spec{Name: "blind-no-sync", Backend: EtcdCluster, Fault: MemberReplace, Control: NoSync})
	broken := clean(Spec{Name: "broken", Backend: Embedded, Fault: KillHolder})
	broken.Trusted.Violations = 1
	undecided := clean(Spec{Name: "undecided", Backend: Etcd, Fault: KillLockd})
	undecided.Linearizable.Inconclusive = true
	blind := clean(Spec{Name: "blind-control", Backend: Embedded, Fault: PauseHolder, Control: FencingOff})
	fencingOff := clean(Spec{Name: "fencing-off", Backend: Embedded, Fault: PauseHolder, Control: FencingOff})
	fencingOff.Overlapping.Violations, fencingOff.PauseHits.Violations = 3, 2
	blindPauses := clean(Spec{Name: "blind-pauses", Backend: Embedded, Fault: PauseHolder, Control: FencingOff})
	blindPauses.Overlapping.Violations = 3
	caught := clean(Spec{Name: "caught-control", Backend: Embedded, Fault: PauseHolder, Control: ReceiveTTL})
	caught.Trusted.Violations = 3
	kept := clean(Spec{Name: "replica-kill-x", Backend: Etcd, Fault: ReplicaKill})
	dropped := clean(Spec{Name: "dropped-session", Backend: PG, Fault: RollingRestart})
	dropped.Lost = 1
	stale := clean(Spec{Name: "stale", Backend: Etcd, Fault: ReplicaKill, Control: StaleRecord})
	stale.Trusted.Violations, stale.Lost = 2, 1 // a control may lose grants
	blindStale := clean(Spec{Name: "blind-stale", Backend: Etcd, Fault: ReplicaKill, Control: StaleRecord})
	lostElsewhere := clean(Spec{Name: "lost-elsewhere", Backend: PG, Fault: PauseHolder})
	lostElsewhere.Pauses, lostElsewhere.Rejected, lostElsewhere.Lost = 1, 1, 1 // a pause loses grants
	// A control with its break off is judged as a real scenario.
	offClean := clean(Spec{Name: "off-clean", Backend: PG, Fault: PauseHolder, Control: FencingOff, BreakOff: true})
	offClean.Pauses, offClean.Rejected = 1, 1
	offFound := clean(Spec{Name: "off-found", Backend: PG, Fault: UpstreamHold, Control: ReceiveTTL, BreakOff: true})
	offFound.Trusted.Violations = 1
	offUnrefused := clean(Spec{Name: "off-unrefused", Backend: PG, Fault: PauseHolder, Control: SlowClock, BreakOff: true})
	offUnrefused.Pauses = 1
	offLost := clean(Spec{Name: "off-lost", Backend: Etcd, Fault: ReplicaKill, Control: StaleRecord, BreakOff: true})
	offLost.Lost = 1
	offUpstream := clean(Spec{Name: "off-upstream", Backend: Embedded, Fault: UpstreamHold, Control: ReceiveTTL, BreakOff: true})
	for _, tc := range []struct {
		rep  *Report
		want bool
	}{{pass, true}, {broken, false}, {undecided, false}, {blind, false}, {caught, true}, {unrefused, false},
		{missed, false}, {stuck, false}, {pending, false}, {noHeal, true}, {blindNoHeal, false},
		{fencingOff, true}, {blindPauses, false}, {kept, true}, {dropped, false}, {stale, true}, {blindStale, false},
		{lostElsewhere, true}, {noSync, true}, {blindNoSync, false}, {offClean, true}, {offFound, false}, {offUnrefused, false}, {offLost, false},
		{offUpstream, true}} {
		if ok, why := tc.rep.Verdict(); ok != tc.want {
			t.Errorf("%s: Verdict = %v (%s); want %v", tc.rep.Spec.Name, ok, why, tc.want)
		}
	}
	if _, why := dropped.Verdict(); !strings.Contains(why, "1 grants lost") {
		t.Errorf("dropped-session: Verdict says %q; want the lost grant named", why)
	}
	table := Table([]*Report{pass, broken, undecided, blind, caught, unrefused, missed, stuck, pending, noHeal})
	for _, want := range []string{"pause-x", "PASS", "FAIL: failed: no-trusted-overlap", "0?",
		"FAIL: control did not fail", "PASS (control receive-ttl caught)", "FAIL: failed: 1 refused writes < 2 pauses",
		"1/2", "FAIL: failed: pauses-hit-holders", "FAIL: failed: recovery", "FAIL: failed: tokens-increase (pending: issue 11 §1)",
		"PASS (control no-heal caught)"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if table := Table([]*Report{offClean}); !strings.Contains(table, "PASS (control fencing-off with its break off: nothing found)") {
		t.Errorf("table of a control with its break off:\n%s", table)
	}
	totals := Totals([]*Report{pass, broken, undecided, blind, caught, offClean})
	if !strings.Contains(totals, "total etcd: 2 scenarios, 20 fenced acquisitions, 4 faults, 1 violations") ||
		!strings.Contains(totals, "total pg: 1 scenarios, 10 fenced acquisitions") {
		t.Errorf("totals:\n%s", totals)
	}
}

// TestPauseStopsEveryThread: pause returns only once the kernel shows every
// thread of the process stopped, and the check it relies on sees a running
// process as running (its control).
func TestPauseStopsEveryThread(t *testing.T) {
	p, err := startProcess("busy", "/bin/sh", []string{"-c", "echo up; while :; do :; done"}, nil,
		filepath.Join(t.TempDir(), "busy.log"), noAnswer(func(string) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.kill()
	pid := p.cmd.Process.Pid
	if stopped, gone := testkit.ThreadsStopped(pid); stopped || gone {
		t.Fatalf("a busy process: stopped=%v gone=%v; want running", stopped, gone)
	}
	if !p.pause() {
		t.Fatalf("pause: not every thread stopped within %v", pauseWait)
	}
	if stopped, gone := testkit.ThreadsStopped(pid); !stopped || gone {
		t.Fatalf("right after pause: stopped=%v gone=%v; want stopped", stopped, gone)
	}
	p.signal(syscall.SIGCONT)
	testkit.Eventually(t, 10*time.Second, "running again after SIGCONT", func() bool {
		stopped, _ := testkit.ThreadsStopped(pid)
		return !stopped
	})
	p.kill()
	if _, gone := testkit.ThreadsStopped(pid); !gone {
		t.Error("after kill: the process is not reported gone")
	}
}
