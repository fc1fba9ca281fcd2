package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/loopback"
)

// etcdReadyTimeout bounds an etcd member's start.
const etcdReadyTimeout = 60 * time.Second

// etcdNode is one test/cmd/etcd process: restartable on its URLs and data
// directory.
type etcdNode struct {
	name      string
	bin       string
	dir       string
	clientURL string
	peerURL   string
	advertise string    // the peer URL the others dial, if not peerURL (peers.go)
	cluster   string    // initial cluster, NAME=PEERURL,...
	state     string    // initial cluster state: "" (new) or "existing" (a member added, members.go)
	addedAt   time.Time // when MemberAdd added it (members.go)

	mu    sync.Mutex
	p     *process
	start int
	down  addrHold // the client and peer addresses, while killed (kill)
}

// addrInUse reports whether a process failed to bind an address someone
// else took between freePort and its bind.
func addrInUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}

// newEtcdNodes prepares n members of one cluster (not started).
func newEtcdNodes(bin, dir string, n int) ([]*etcdNode, error) {
	nodes := make([]*etcdNode, n)
	var peers []string
	ports, err := loopback.FreePorts(2 * n)
	if err != nil {
		return nil, fmt.Errorf("etcd ports: %w", err)
	}
	for i := range nodes {
		cp, pp := ports[2*i], ports[2*i+1]
		nodes[i] = &etcdNode{
			name:      fmt.Sprintf("etcd%d", i),
			bin:       bin,
			dir:       dir,
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", cp),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", pp),
		}
		peers = append(peers, nodes[i].name+"="+nodes[i].peerURL)
	}
	for _, nd := range nodes {
		nd.cluster = strings.Join(peers, ",")
	}
	return nodes, nil
}

// etcdStartAttempts bounds the starts of a new cluster that another
// process's socket took a chosen port from.
const etcdStartAttempts = 3

// startEtcd starts every member and waits until all serve. When a member
// could not bind its port (another process took it after freePorts), the
// cluster is started again from scratch on other ports.
func startEtcd(bin, dir string, n int) ([]*etcdNode, error) {
	for attempt := 1; ; attempt++ {
		nodes, err := newEtcdNodes(bin, dir, n)
		if err != nil {
			return nil, err
		}
		started, err := launchEtcd(nodes)
		if err == nil || !addrInUse(err) || attempt == etcdStartAttempts {
			return started, err
		}
		for _, nd := range nodes { // launchEtcd killed them all
			if err := os.RemoveAll(nd.dataDir()); err != nil {
				return nil, err
			}
		}
	}
}

// launchEtcd starts prepared members and waits until all serve.
func launchEtcd(nodes []*etcdNode) ([]*etcdNode, error) {
	errs := make([]error, len(nodes))
	failed := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Add(1)
		go func() { // a cluster's members become ready together
			defer wg.Done()
			if errs[i] = nd.launch(); errs[i] != nil {
				once.Do(func() { close(failed) })
			}
		}()
	}
	done := make(chan struct{})
	go func() { // returns once every launch has
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-failed:
		// The others would wait for a quorum until etcdReadyTimeout.
		for _, nd := range nodes {
			if p := nd.proc(); p != nil {
				p.kill()
			}
		}
		<-done
	}
	if err := errors.Join(errs...); err != nil {
		for _, nd := range nodes {
			if p := nd.proc(); p != nil {
				p.kill()
			}
		}
		return nil, err
	}
	return nodes, nil
}

func (e *etcdNode) launch() error {
	e.mu.Lock()
	e.start++
	n := e.start
	e.mu.Unlock()
	ready := make(chan struct{}, 1)
	onLine := func(line string) {
		if strings.HasPrefix(line, "etcd serving ") {
			select {
			case ready <- struct{}{}:
			default:
			}
		}
	}
	args := []string{
		"-name", e.name,
		"-data-dir", e.dataDir(),
		"-client-url", e.clientURL,
		"-peer-url", e.peerURL,
		"-initial-cluster", e.cluster,
		"-tick-ms", "100",
		"-election-ms", "1000",
	}
	if e.advertise != "" {
		args = append(args, "-advertise-peer-url", e.advertise)
	}
	if e.state != "" {
		args = append(args, "-initial-cluster-state", e.state)
	}
	p, err := startProcess(fmt.Sprintf("%s.%d", e.name, n), e.bin, args, nil,
		filepath.Join(e.dir, e.name+".log"), noAnswer(onLine))
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.p = p // before it is ready: launchEtcd may have to kill it
	e.mu.Unlock()
	_, err = waitLine(p, ready, etcdReadyTimeout)
	return err
}

func (e *etcdNode) dataDir() string { return filepath.Join(e.dir, e.name+"-data") }

func (e *etcdNode) proc() *process {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.p
}

// kill SIGKILLs the member and holds its addresses until restart.
func (e *etcdNode) kill() {
	e.proc().kill()
	e.down.hold(hostPort(e.clientURL), hostPort(e.peerURL))
}

// restart starts the member again on its URLs and data directory, then
// releases the hold kill put on its addresses.
func (e *etcdNode) restart() error {
	defer e.down.release()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = e.launch(); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("restart %s: %w", e.name, err)
}

// stop shuts the member down; an error if it had died on its own.
func (e *etcdNode) stop() error {
	defer e.down.release() // held if a cycle failed between a kill and its restart
	p := e.proc()
	if p.done() {
		return p.failure()
	}
	if p.stop(30 * time.Second) {
		return fmt.Errorf("%s did not stop within 30s of SIGTERM; killed it", p.name)
	}
	return nil
}

// endpoints returns the client URLs of nodes.
func endpoints(nodes []*etcdNode) []string {
	var eps []string
	for _, nd := range nodes {
		eps = append(eps, nd.clientURL)
	}
	return eps
}

// etcdLeader returns the member that leads the cluster now, asking each
// member in turn.
func etcdLeader(ctx context.Context, nodes []*etcdNode) (*etcdNode, error) {
	var errs []error
	for _, nd := range nodes {
		if nd.proc().done() {
			continue
		}
		id, leader, err := memberStatus(ctx, nd.clientURL)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if leader == 0 {
			continue
		}
		if id == leader {
			return nd, nil
		}
	}
	return nil, fmt.Errorf("no etcd leader found: %w", errors.Join(errs...))
}

func memberStatus(ctx context.Context, ep string) (id, leader uint64, err error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, 0, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(sctx, ep)
	if err != nil {
		return 0, 0, fmt.Errorf("status of %s: %w", ep, err)
	}
	return st.Header.GetMemberId(), st.Leader, nil
}
