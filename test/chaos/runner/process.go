package runner

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// process is a child process of the harness: its stdout is read line by
// line and handed to onLine, its stderr goes to a log file. The kernel kills
// it (SIGKILL) if the harness dies first.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once the process has exited and stdout is drained

	mu      sync.Mutex
	exitErr error

	stdinMu sync.Mutex
	stdin   io.Writer // closed by Wait
}

// startProcess starts bin with args and extra environment variables.
// onLine, if not nil, is called for every stdout line, from one goroutine,
// in order; a non-empty answer it returns is written to the process's
// stdin as a line (the chaos worker's hold acknowledgement). A line handler
// that answers later, from elsewhere, uses answer.
func startProcess(name, bin string, args, env []string, logPath string, onLine func(string) (answer string)) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Env = testkit.ChildEnv([]string{"LOCKD_"}, env...)
	cmd.Stderr = logf
	cmd.Dir = filepath.Dir(logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	stdin, err := cmd.StdinPipe() // closed by Wait
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{}), stdin: stdin}
	// This goroutine ends when the process has exited (its stdout closes
	// then; a killed process's pipe closes with it).
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if onLine == nil {
				continue
			}
			if a := onLine(sc.Text()); a != "" {
				p.answer(a)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// answer writes line to the process's stdin. An error means the process is
// exiting: nobody waits for the line.
func (p *process) answer(line string) {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	_, _ = io.WriteString(p.stdin, line+"\n")
}

// signal sends sig unless the process has exited.
func (p *process) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
}

// pauseWait bounds how long pause waits for every thread to stop.
const pauseWait = 2 * time.Second

// pause SIGSTOPs the process and returns once every one of its threads is
// stopped, or false after pauseWait. kill(2) returns once the signal is
// queued: a thread running on another core goes on for a moment, on a
// loaded machine long enough to read an answer written right after and act
// on it (a far-holder pause raced its worker's second write that way once,
// the write invoked 63 µs after the SIGSTOP and accepted 1.2 ms later).
func (p *process) pause() bool {
	p.signal(syscall.SIGSTOP)
	for end := time.Now().Add(pauseWait); ; {
		if stopped, gone := testkit.ThreadsStopped(p.cmd.Process.Pid); stopped || gone {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond) // polling the kernel's view of the threads, not synchronising with them
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	p.signal(syscall.SIGCONT) // harmless; a stopped process dies of SIGKILL anyway
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// stop sends SIGCONT and SIGTERM and waits up to timeout for the exit, then
// kills it. It reports whether the process had to be killed.
func (p *process) stop(timeout time.Duration) (killed bool) {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return false
	case <-t.C:
		p.kill()
		return true
	}
}

// done reports whether the process has exited.
func (p *process) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// err returns the exit error (nil for exit status 0) once exited.
func (p *process) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// failure describes an unexpected exit for reports, with the end of the
// process's log.
func (p *process) failure() error {
	return fmt.Errorf("%s exited: %v\n%s", p.name, p.err(), tailFile(p.logPath, 1500))
}

// tailFile returns the last n bytes of a file, for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// waitLine waits for the first value sent on ch, the process's exit, or
// the timeout.
func waitLine[T any](p *process, ch <-chan T, timeout time.Duration) (T, error) {
	var zero T
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v := <-ch:
		return v, nil
	case <-p.exited:
		// The line may have raced the exit.
		select {
		case v := <-ch:
			return v, nil
		default:
		}
		return zero, p.failure()
	case <-t.C:
		p.kill()
		return zero, errors.Join(fmt.Errorf("%s: not ready after %v", p.name, timeout), p.failure())
	}
}

// noAnswer adapts a line handler that never answers to startProcess.
func noAnswer(f func(string)) func(string) string {
	if f == nil {
		return nil
	}
	return func(l string) string { f(l); return "" }
}
