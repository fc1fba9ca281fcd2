package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// The faults and the control of issue 11 §8.
const (
	// QuorumLoss SIGKILLs two of the three etcd members (all but member
	// cycle mod 3, so the leader goes down in some cycles and survives
	// without a quorum in others) for two TTLs, then restarts both.
	QuorumLoss Fault = "etcd-quorum-loss"
	// LeaderIsolate cuts the etcd leader's peer links (peers.go) for three
	// TTLs: the other two members elect a new leader while the old one
	// keeps running, isolated, with lockd still able to reach it as a
	// client; then heals.
	LeaderIsolate Fault = "etcd-leader-isolated"
	// LockdPause runs two lockd replicas on one backend, workers spread
	// over both, and SIGSTOPs one (alternately) for two TTLs while the
	// other serves, then SIGCONTs it.
	LockdPause Fault = "lockd-pause"
	// RestartEmpty SIGKILLs the embedded lockd, deletes its data directory
	// and starts it again on an empty one (issue 11 §1: the token order
	// must survive it).
	RestartEmpty Fault = "restart-empty-data"
	// RestartOlder SIGKILLs the embedded lockd and starts it again: on
	// even cycles after copying its data directory aside, on odd ones on
	// that older copy (a restore from a backup; issue 11 §1).
	RestartOlder Fault = "restart-older-data"
)

// NoHeal is the control of check.Recovery: a partition recorded as ended
// while the link stays cut for longer than the recovery bound (noHeal): the
// keys are not granted again in time and check.Recovery must report it.
const NoHeal Control = "no-heal"

// cycle11 runs a cycle of the faults above; handled is false for another
// fault.
func (r *run) cycle11(ctx context.Context, i int) (handled bool, err error) {
	ttl := r.opts.TTL
	switch r.spec.Fault {
	case QuorumLoss:
		return true, r.quorumLoss(ctx, i)
	case LeaderIsolate:
		return true, r.isolateLeader(ctx)
	case LockdPause:
		l := r.lockds[i%len(r.lockds)]
		start := r.clock.Now()
		if !l.proc().pause() {
			r.logf("replica %s: not every thread stopped within %v of SIGSTOP", l.cfg.name, pauseWait)
		}
		r.countFault()
		r.logf("paused replica %s", l.cfg.name)
		serr := sleep(ctx, 2*ttl)
		l.proc().signal(syscall.SIGCONT)
		r.faultWindow(start)
		if serr != nil {
			return true, serr
		}
		return true, sleep(ctx, 2*ttl)
	case RestartEmpty, RestartOlder:
		return true, r.restartData(ctx, i)
	}
	return false, nil
}

// quorumLoss kills every etcd member but one for two TTLs.
func (r *run) quorumLoss(ctx context.Context, i int) error {
	keep := r.etcd[i%len(r.etcd)]
	var down []*etcdNode
	start := r.clock.Now()
	for _, nd := range r.etcd {
		if nd != keep {
			nd.kill()
			down = append(down, nd)
		}
	}
	r.countFault()
	r.logf("killed etcd %s and %s; %s runs without a quorum", down[0].name, down[1].name, keep.name)
	serr := sleep(ctx, 2*r.opts.TTL)
	// Both at once: each needs a quorum to report ready.
	errs := make([]error, len(down))
	var wg sync.WaitGroup
	for j, nd := range down {
		wg.Add(1)
		go func() { // returns once the member serves or gave up
			defer wg.Done()
			errs[j] = nd.restart()
		}()
	}
	wg.Wait()
	if err := errors.Join(append(errs, serr)...); err != nil {
		return err
	}
	r.faultWindow(start)
	return sleep(ctx, 2*r.opts.TTL)
}

// restartData restarts the embedded lockd on an empty or an older data
// directory.
func (r *run) restartData(ctx context.Context, i int) error {
	l := r.lockds[0]
	data := l.dataDir()
	backup := filepath.Join(r.dir, "data-backup")
	start := r.clock.Now()
	l.kill()
	r.countFault()
	what := "an empty data directory"
	switch {
	case r.spec.Fault == RestartEmpty:
		if err := os.RemoveAll(data); err != nil {
			return err
		}
	case i%2 == 0:
		what = "its data directory (copied aside)"
		if err := os.RemoveAll(backup); err != nil {
			return err
		}
		if err := copyDir(data, backup); err != nil {
			return err
		}
	default:
		what = "the older copy of its data directory"
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		if err := copyDir(backup, data); err != nil {
			return err
		}
	}
	if err := l.restart(); err != nil {
		return err
	}
	r.faultWindow(start)
	r.logf("killed %s, restarted it on %s", l.cfg.name, what)
	return sleep(ctx, 2*r.opts.TTL)
}

// dataDir is the embedded backend's data directory.
func (l *lockdProc) dataDir() string { return filepath.Join(l.cfg.dir, l.cfg.name+"-data") }

// copyDir copies the regular files and directories below src to dst; a
// unix socket (the embedded etcd's client socket, recreated at start) is
// skipped, as a backup tool would.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		case info.Mode().Type() == fs.ModeSocket:
			return nil
		}
		return fmt.Errorf("copy %s: not a regular file or directory", path)
	})
}

// isolateLeader cuts the etcd leader's peer links for three TTLs, then
// heals them.
func (r *run) isolateLeader(ctx context.Context) error {
	leader, err := etcdLeader(ctx, r.etcd)
	if err != nil {
		return err
	}
	start := r.clock.Now()
	if err := r.peers.isolate(ctx, r.etcd, leader.name); err != nil {
		return err
	}
	r.countFault()
	r.logf("isolated etcd leader %s from the other members (it keeps running)", leader.name)
	serr := sleep(ctx, 3*r.opts.TTL)
	if nl, err := etcdLeader(ctx, r.etcd); err == nil {
		r.logf("etcd leader during the isolation: %s", nl.name)
	}
	r.peers.heal()
	r.faultWindow(start)
	if serr != nil {
		return serr
	}
	return sleep(ctx, 2*r.opts.TTL)
}
