package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/lockd/test/chaos/history"
	"lock.dev/lockd/test/chaos/worker"
)

// workerSpec is what one worker slot runs.
type workerSpec struct {
	lockd             []string // addresses, in the order the worker tries them
	holdMin, holdMax  time.Duration
	clockScale        float64
	trust             worker.Trust
	heartbeatInterval time.Duration
	bin               string   // the worker binary; "" is Binaries.Worker
	keys              []string // the keys it takes; nil is every key of the run
	limit             uint32   // semaphore limit (-limit), 0 for none
	rw                bool     // read/write lock grants (-rw)
	pairs             bool     // keys[0] then, holding it, keys[1] (-pairs, deadlock.go)
	// sessionTTL is the TTL of the worker's sessions (-ttl); 0 is lockd's.
	sessionTTL time.Duration
	// sdk is the SDK of the worker: the Go one (GoSDK), or the Python or
	// TypeScript worker.
	sdk SDK
	// env adds to the worker's environment.
	env []string
}

// workerProc is one incarnation of a worker slot. Its state follows the
// worker's stdout lines (package worker doc).
type workerProc struct {
	slot int
	proc string // history process id
	p    *process
	// history is the worker's history file: every worker creates it
	// after it took SIGTERM (started).
	history string

	mu       sync.Mutex
	state    string // wait, hold or free
	key      string
	token    uint64 // the token of the latest hold
	mode     string // the mode of the latest hold (plain, slot, shared, exclusive)
	session  string // the session of the latest wait line, "" if not given
	pausable bool
	peer     string // the lockd replica of the latest grant ("hold" line), "" if unknown
	stopped  bool   // SIGSTOPped by the harness and not resumed yet
	killed   bool   // SIGKILLed by the harness
	holdBack bool   // withholdAck asked to keep the current hold line's answer
	ackOwed  bool   // a hold line's answer was kept back: answerHold sends it

	// trig, if set, fires on the next matching line (see trigger).
	trig atomic.Pointer[trigger]
	// bar, if set, may keep the answer to the worker's hold lines back
	// (holdBarrier).
	bar atomic.Pointer[holdBarrier]
	// holds and frees count the worker's hold and free lines.
	holds, frees atomic.Int64
	// onHold, if set, is called with the key of every grant reported.
	onHold func(key string)
}

// trigger runs an action on the first of several workers to print a
// matching line, in that worker's stdout reader, so that the action lands
// within a few milliseconds of the state change (a pause between a
// holder's two writes, a kill of lockd while an acquire is in flight).
type trigger struct {
	on     string // "wait" or "hold" (pausable holds only)
	once   sync.Once
	fired  chan *workerProc // receives the worker it fired on
	action func(w *workerProc)
}

func (tr *trigger) fire(w *workerProc) {
	tr.once.Do(func() {
		tr.action(w)
		tr.fired <- w
	})
}

// onLine follows the worker's state from its stdout lines. It answers
// every hold line with "go" (the worker runs with -hold-ack and waits for
// it before the grant's second write), after the trigger's action: a pause
// has then stopped the worker before it can read the answer, so the second
// write always comes after the pause and never races it. An action that
// called withholdAck answers later (answerHold).
func (w *workerProc) onLine(line string) (answer string) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return ""
	}
	w.mu.Lock()
	w.state, w.key = f[0], f[1]
	w.pausable = f[0] == "hold" && len(f) >= 4 && f[3] == "1"
	if f[0] == "hold" && len(f) >= 3 {
		w.token, _ = strconv.ParseUint(f[2], 10, 64)
	}
	if f[0] == "hold" && len(f) >= 5 {
		w.mode = f[4]
	}
	if f[0] == "wait" {
		w.session = ""
		if len(f) >= 3 {
			w.session = f[2]
		}
	}
	if f[0] == "hold" && len(f) >= 6 && f[5] != "-" {
		w.peer = f[5]
	}
	state, pausable := w.state, w.pausable
	w.mu.Unlock()
	switch state {
	case "hold":
		w.holds.Add(1)
		if w.onHold != nil {
			w.onHold(f[1])
		}
	case "free":
		w.frees.Add(1)
	}
	if tr := w.trig.Load(); tr != nil && tr.on == state && (state != "hold" || pausable) {
		tr.fire(w)
	}
	if b := w.bar.Load(); b != nil && state == "hold" {
		b.join(w)
	}
	if state == "hold" {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.holdBack {
			w.holdBack, w.ackOwed = false, true
			return ""
		}
		return "go"
	}
	return ""
}

// withholdAck, called from a trigger's action on a hold line, keeps that
// line's answer back: the worker keeps holding (its SDK heartbeating) until
// answerHold.
func (w *workerProc) withholdAck() {
	w.mu.Lock()
	w.holdBack = true
	w.mu.Unlock()
}

// answerHold sends the answer withholdAck kept back (once; a no-op without
// one), so that the worker goes on to its second write and its release.
func (w *workerProc) answerHold() {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.ackOwed:
		w.ackOwed = false
		w.p.answer("go")
	case w.holdBack: // onLine has not decided yet: let it answer
		w.holdBack = false
	}
}

// waiting reports whether the worker's latest line is "wait": an acquire
// of it is in flight.
func (w *workerProc) waiting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state == "wait"
}

// held returns the key, token and mode of the worker's latest hold line.
func (w *workerProc) held() (key string, token uint64, mode string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.key, w.token, w.mode
}

// waitingIn returns the session of the acquire the worker's latest line
// says is in flight, "" if it is not waiting (or did not say).
func (w *workerProc) waitingIn() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != "wait" {
		return ""
	}
	return w.session
}

// holdMode returns the mode of the worker's latest hold line.
func (w *workerProc) holdMode() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode
}

// replica returns the address of the lockd replica the worker's latest
// grant came through, "" if none is known yet.
func (w *workerProc) replica() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peer
}

// markStopped records a SIGSTOP or SIGCONT by the harness.
func (w *workerProc) markStopped(v bool) {
	w.mu.Lock()
	w.stopped = v
	w.mu.Unlock()
}

func (w *workerProc) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

func (w *workerProc) markKilled() {
	w.mu.Lock()
	w.killed = true
	w.mu.Unlock()
}

func (w *workerProc) wasKilled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.killed
}

// procID is the history id of incarnation n (from 1) of slot.
func procID(slot, n int) string {
	if n == 1 {
		return "w" + strconv.Itoa(slot)
	}
	return fmt.Sprintf("w%d.%d", slot, n)
}

// startWorker starts incarnation n of slot.
func (r *run) startWorker(slot, n int) (*workerProc, error) {
	ws := r.workerSpecs[slot]
	w := &workerProc{slot: slot, proc: procID(slot, n), state: "free", onHold: r.sawHold}
	w.history = filepath.Join(r.histDir, w.proc+".jsonl")
	keys := ws.keys
	if keys == nil {
		keys = r.keys
	}
	args := []string{
		"-proc", w.proc,
		"-lockd", strings.Join(ws.lockd, ","),
		"-fenced", r.fenced.URL(),
		"-history", w.history,
		"-keys", strings.Join(keys, ","),
		"-limit", strconv.FormatUint(uint64(ws.limit), 10),
		"-rw=" + strconv.FormatBool(ws.rw),
		"-pairs=" + strconv.FormatBool(ws.pairs),
		"-hold-min", ws.holdMin.String(),
		"-hold-max", ws.holdMax.String(),
		"-clock-scale", strconv.FormatFloat(ws.clockScale, 'g', -1, 64),
		"-trust", string(ws.trust),
		"-heartbeat-interval", ws.heartbeatInterval.String(),
		"-ttl", ws.sessionTTL.String(),
		"-seed", strconv.FormatUint(r.seed+uint64(slot)*1000+uint64(n), 10),
		"-hold-ack",
	}
	bin := r.env.bins.Worker
	if ws.bin != "" {
		bin = ws.bin
	}
	env := append([]string{history.EpochEnv + "=" + history.FormatEpoch(r.clock.Epoch())}, ws.env...)
	switch ws.sdk {
	case PythonSDK:
		var extra []string
		bin, args, extra = r.pythonCommand(args)
		env = append(env, extra...)
	case TypeScriptSDK:
		bin, args = r.typescriptCommand(args)
	}
	p, err := startProcess(w.proc, bin, args, env,
		filepath.Join(r.dir, w.proc+".log"), w.onLine)
	if err != nil {
		return nil, err
	}
	w.p = p
	return w, nil
}

// startTimeout bounds the wait for a worker to have started (started).
const startTimeout = 20 * time.Second

// started waits until the worker has created its history file, which every
// worker (Go, Python, TypeScript) does only after it has taken SIGTERM and
// SIGINT, or has exited, polling for at most timeout; it reports whether
// the worker started or exited. A SIGTERM before that finds the runtime's
// default action: a Node worker restarted just before the end of a
// scenario was terminated by it during Node's start-up (0.4–1.1 s on a
// loaded machine), without a history ("w1.2 exited: signal: terminated").
func (w *workerProc) started(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(w.history); err == nil || w.p.done() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-w.p.exited:
		case <-tick.C:
		}
	}
}
