package runner

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/loopback"
)

// The membership fault of issue 21 §2.
const (
	// MemberReplace replaces one member of the three-member etcd cluster
	// per cycle, the oldest first (cycle i replaces the member in slot
	// i mod 3), while the workers hold and wait: MemberRemove through
	// clientv3's Cluster API, the removed member's exit (test/cmd/etcd
	// exits once it learns it was removed, as etcd does), then MemberAdd
	// of a member with a new name, new ports and an empty data directory,
	// started with --initial-cluster-state existing. Three cycles (the
	// short mode) leave no member lockd was started with: lockd must
	// follow the member list (lock.etcd.auto-sync-interval, C5
	// #ct5-etcd-members) to serve on.
	MemberReplace Fault = "etcd-member-replace"
)

// NoSync is the control of MemberReplace: lockd started with
// lock.etcd.auto-sync-interval 0 keeps dialling the endpoints it was
// started with. Once the last of those members is removed it reaches no
// member (their client ports stay bound by the harness, so nothing else
// answers there), and check.Recovery must report keys not granted again.
const NoSync Control = "no-sync"

// memberSyncInterval is lockd's lock.etcd.auto-sync-interval under
// MemberReplace: the least C5 allows, a fraction of a cycle (2 TTLs after
// each replacement, and etcd's own 5 s before the next removal).
const memberSyncInterval = time.Second

// memberOpTimeout bounds each step of a replacement: the removal (retried
// while etcd answers "unhealthy cluster", which it does until the other
// members have been connected for 5 s, e.g. the one the previous cycle
// added), the removed member's exit, the addition (retried through the
// election that follows a leader's removal) and the new member's start.
const memberOpTimeout = 30 * time.Second

// memberCallTimeout bounds one member API call. A member change commits in
// milliseconds, but one proposed while a removed leader's successor takes
// over can be dropped and never answered: retried after 2 s rather than
// after etcd's own request timeout (7 s). A retried call whose first try
// was applied after all is recognised (member not found, peer URL exists).
const memberCallTimeout = 2 * time.Second

// members is what MemberReplace keeps across cycles.
type members struct {
	used     map[string]bool // every host:port a member of the run has had
	original []string        // the client URLs the cluster started with
	retired  []*retiredMember
	added    int
}

// retiredMember is a removed member: its process, and its client port,
// which the harness keeps bound (bindHold) until the end of the run.
type retiredMember struct {
	node *etcdNode
	fd   int
	held bool
}

// cycle21 runs a cycle of the fault above; handled is false for another
// fault.
func (r *run) cycle21(ctx context.Context, i int) (handled bool, err error) {
	if r.spec.Fault != MemberReplace {
		return false, nil
	}
	return true, r.replaceMember(ctx, i)
}

// lockdAutoSync is the --etcd-auto-sync-interval of replica i ("": the
// default): off when it reaches etcd through the proxy, whose address the
// member list would replace, and under the NoSync control.
func (r *run) lockdAutoSync(i int) string {
	switch {
	case r.viaProxy(i), r.spec.Control == NoSync && !r.spec.BreakOff:
		return "0"
	case r.spec.Fault == MemberReplace:
		return memberSyncInterval.String()
	}
	return ""
}

func (r *run) memberState() *members {
	if r.members == nil {
		m := &members{used: map[string]bool{}, original: endpoints(r.etcd)}
		for _, nd := range r.etcd {
			m.use(nd.clientURL, nd.peerURL)
		}
		r.members = m
	}
	return r.members
}

func (m *members) use(urls ...string) {
	for _, u := range urls {
		if p, err := url.Parse(u); err == nil {
			m.used[p.Host] = true
		}
	}
}

// freshURL returns an http URL on a free loopback port that no member of
// the run has had: a lockd that does not follow the member list must not
// reach a new member on an old member's address.
func (m *members) freshURL() (string, error) {
	for range 100 {
		p, err := loopback.FreePort()
		if err != nil {
			return "", err
		}
		host := "127.0.0.1:" + strconv.Itoa(p)
		if !m.used[host] {
			m.used[host] = true
			return "http://" + host, nil
		}
	}
	return "", errors.New("no fresh loopback port in 100 tries")
}

// replaceMember is one MemberReplace cycle.
func (r *run) replaceMember(ctx context.Context, i int) error {
	m := r.memberState()
	slot := i % len(r.etcd)
	victim := r.etcd[slot]
	start, t0 := r.clock.Now(), time.Now()
	if err := r.removeMember(ctx, victim); err != nil {
		return err
	}
	removed := time.Since(t0)
	rm := &retiredMember{node: victim}
	m.retired = append(m.retired, rm)
	t := time.NewTimer(memberOpTimeout)
	select {
	case <-victim.proc().exited:
		t.Stop()
	case <-t.C:
		victim.kill()
		r.problem("removed etcd member %s did not exit by itself within %v; killed it", victim.name, memberOpTimeout)
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	exited := time.Since(t0)
	if u, err := url.Parse(victim.clientURL); err == nil {
		rm.fd, rm.held = bindHold(u.Host)
	}

	nd, err := r.addAndStart(ctx, m, victim)
	if err != nil {
		return err
	}
	added := nd.addedAt.Sub(t0)
	r.etcd[slot] = nd
	r.faultWindow(start)
	r.countFault()
	now := endpoints(r.etcd)
	gone := !slices.ContainsFunc(now, func(ep string) bool { return slices.Contains(m.original, ep) })
	left := "some of the original members remain"
	if gone {
		left = "none of the original members remains"
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	r.logf("replaced etcd member %s by %s (removal accepted at %s, exit at %s, addition at %s, new member serving at %s); members %v (%s; lockd was started with %v)",
		victim.name, nd.name, ms(removed), ms(exited), ms(added), ms(time.Since(t0)), now, left, m.original)
	wait := 2 * r.opts.TTL
	if r.spec.Control == NoSync && !r.spec.BreakOff && gone {
		// The control's lockd now reaches no member. Within the 2 TTLs
		// every worker's session has ended (nothing keeps it alive), and
		// each worker is in a session open or an acquire for its next key,
		// retried every 50 ms; running on for the recovery bound past them
		// lets check.Recovery decide those wants: never granted again.
		wait += r.livenessBound()
	}
	return sleep(ctx, wait)
}

// addAndStart adds a member with new ports and an empty data directory,
// through the members but removed, and starts it. If another process took
// one of its ports before it bound them, the unstarted member is removed
// again and the next one gets other ports.
func (r *run) addAndStart(ctx context.Context, m *members, removed *etcdNode) (*etcdNode, error) {
	for attempt := 1; ; attempt++ {
		m.added++
		nd := &etcdNode{name: fmt.Sprintf("etcd%d", len(m.original)-1+m.added), bin: removed.bin, dir: removed.dir,
			state: "existing"}
		var err error
		if nd.clientURL, err = m.freshURL(); err != nil {
			return nil, err
		}
		if nd.peerURL, err = m.freshURL(); err != nil {
			return nil, err
		}
		var id uint64
		if nd.cluster, id, err = r.addMember(ctx, nd, removed); err != nil {
			return nil, err
		}
		nd.addedAt = time.Now()
		err = nd.launch()
		if err == nil {
			return nd, nil
		}
		if !addrInUse(err) || attempt == etcdStartAttempts {
			return nil, fmt.Errorf("start added etcd member %s: %w", nd.name, err)
		}
		r.logf("added etcd member %s could not bind its ports; removing it and adding another", nd.name)
		if err := r.removeMemberID(ctx, nd.name, id, removed); err != nil {
			return nil, err
		}
	}
}

// endpointsBut returns the client URLs of every member but one.
func (r *run) endpointsBut(but *etcdNode) []string {
	var eps []string
	for _, nd := range r.etcd {
		if nd != but {
			eps = append(eps, nd.clientURL)
		}
	}
	return eps
}

// removeMember removes victim from the cluster through the other members.
func (r *run) removeMember(ctx context.Context, victim *etcdNode) error {
	return r.removeMemberID(ctx, victim.name, 0, victim)
}

// removeMemberID removes the member named name (its id, or 0 to look it up)
// through the members but skip.
func (r *run) removeMemberID(ctx context.Context, name string, id uint64, skip *etcdNode) error {
	return retryMember(ctx, "remove etcd member "+name, r.endpointsBut(skip), func(ctx context.Context, cli *clientv3.Client) error {
		if id == 0 {
			list, err := cli.MemberList(ctx)
			if err != nil {
				return err
			}
			for _, mem := range list.Members {
				if mem.Name == name {
					id = mem.ID
				}
			}
			if id == 0 {
				return fmt.Errorf("not in the member list %v", list.Members)
			}
		}
		_, err := cli.MemberRemove(ctx, id)
		if errors.Is(err, rpctypes.ErrMemberNotFound) { // an earlier attempt was applied, its answer lost
			return nil
		}
		return err
	})
}

// addMember adds nd (not started) to the cluster, through the members but
// the removed one, and returns its id and its --initial-cluster: every
// member the cluster has then, nd included.
func (r *run) addMember(ctx context.Context, nd, removed *etcdNode) (cluster string, id uint64, err error) {
	err = retryMember(ctx, "add etcd member "+nd.name, r.endpointsBut(removed), func(ctx context.Context, cli *clientv3.Client) error {
		var mems []*etcdserverpb.Member
		resp, err := cli.MemberAdd(ctx, []string{nd.peerURL})
		switch {
		case errors.Is(err, rpctypes.ErrPeerURLExist): // an earlier attempt was applied, its answer lost
			list, lerr := cli.MemberList(ctx)
			if lerr != nil {
				return lerr
			}
			mems = list.Members
		case err != nil:
			return err
		default:
			mems, id = resp.Members, resp.Member.ID
		}
		var peers []string
		for _, mem := range mems {
			name := mem.Name
			if mem.ID == id || slices.Contains(mem.PeerURLs, nd.peerURL) {
				name, id = nd.name, mem.ID
			}
			for _, u := range mem.PeerURLs {
				peers = append(peers, name+"="+u)
			}
		}
		cluster = strings.Join(peers, ",")
		return nil
	})
	return cluster, id, err
}

// retryMember calls f with a client of eps, one call at a time, until it
// returns nil or memberOpTimeout has passed.
func retryMember(ctx context.Context, what string, eps []string, f func(context.Context, *clientv3.Client) error) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer cli.Close()
	end := time.Now().Add(memberOpTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, memberCallTimeout)
		err = f(cctx, cli)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s: not done within %v: %w", what, memberOpTimeout, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// retired reports whether nd was removed from the cluster.
func (r *run) retired(nd *etcdNode) bool {
	return r.members != nil && slices.ContainsFunc(r.members.retired, func(rm *retiredMember) bool { return rm.node == nd })
}

// closeMembers stops what MemberReplace left: a removed member still
// running (a cycle that failed) and the client ports held.
func (r *run) closeMembers() {
	if r.members == nil {
		return
	}
	for _, rm := range r.members.retired {
		if p := rm.node.proc(); p != nil && !p.done() {
			p.kill()
		}
		if rm.held {
			_ = syscall.Close(rm.fd)
		}
	}
}
