package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/loopback"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store/etcdstore"
)

// The scale scenario (issue 24, "Scale, past one machine"): idle sessions
// spread over R `lockd serve` replicas on one three-member etcd, each
// member a `lockd bench etcd-server` process of its own; at each point
// (sessions × replicas) the etcd leader's CPU, the followers', the
// replicas' and the clients' per 1 000 sessions at the bench's session TTL.
// Only when named (Optional): it starts a cluster of its own and runs a
// few minutes.
const scScale = "scale"

// scaleMembers is the scale scenario's etcd cluster size.
const scaleMembers = 3

// Defaults of the scale scenario (Config.ScaleSessions, ScaleReplicas,
// ScaleDuration): six points of a 15 s window each (a heartbeat interval
// is TTL/3 = 5 s, so three of every session's heartbeats fall in it).
var (
	DefaultScaleSessions = []int{1000, 5000, 10000}
	DefaultScaleReplicas = []int{1, 3}
	DefaultScaleDuration = 15 * time.Second
)

// The scale scenario's metrics; Row.N is the sessions, Row.Replicas the
// replicas of the point.
const (
	MetricLeaderCPU          = "etcd leader cpu % of a core"
	MetricFollowersCPU       = "etcd followers cpu % of a core"
	MetricReplicasCPU        = "lockd replicas cpu % of a core"
	MetricLeaderCPUPer1000   = "etcd leader cpu % per 1000 sessions"
	MetricReplicasCPUPer1000 = "lockd cpu % per 1000 sessions"
	// The slopes: the least-squares line of the figure against N over a
	// replica count's points (at least two session counts), in % of a core
	// per 1000 sessions: the cost of 1000 more sessions, without the
	// cluster's and the replicas' cost at no sessions.
	MetricLeaderSlope   = "etcd leader cpu % per 1000 more sessions"
	MetricReplicasSlope = "lockd cpu % per 1000 more sessions"
)

// etcdScalePrefix is the scale scenario's key prefix (one per point under
// it) on its own cluster.
const etcdScalePrefix = "/lockd-bench-scale/"

// scaleNote explains the scale rows.
const scaleNote = "scale: N idle sessions (SDK clients in the bench process, up to 1000 sessions per client, clients spread round-robin over " +
	"the replicas) on R `lockd serve` replicas given all three members of a 3-member etcd (each member its own `lockd bench etcd-server` " +
	"process, fsync on); after a settle of a quarter of the window (at most 5 s) the CPU of the etcd leader (found by Status before and " +
	"after the window), of the two followers together, of every replica together and of the bench process; per 1000 sessions = " +
	"the figure / (N / 1000); session TTL 15 s, heartbeat interval TTL/3"

// scaleCluster is the scale scenario's etcd: its members' processes and
// client URLs, and a client on all of them.
type scaleCluster struct {
	members []*child
	urls    []string
	cli     *clientv3.Client
}

// startScaleCluster starts scaleMembers etcd processes forming one new
// cluster (data under dir) and connects a client to them.
func startScaleCluster(ctx context.Context, lockd []string, dir string) (c *scaleCluster, err error) {
	ports, err := loopback.FreePorts(2 * scaleMembers)
	if err != nil {
		return nil, fmt.Errorf("etcd ports: %w", err)
	}
	var peers []string
	for i := range scaleMembers {
		peers = append(peers, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	c = &scaleCluster{members: make([]*child, scaleMembers), urls: make([]string, scaleMembers)}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	// The members become ready together (a new cluster serves once it has a
	// quorum), so they start at once.
	errs := make([]error, scaleMembers)
	var wg sync.WaitGroup
	for i := range scaleMembers {
		c.urls[i] = fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		args := append(slices.Clone(EtcdServerCommand), "--data-dir", filepath.Join(dir, "m"+strconv.Itoa(i)), "--name", "m"+strconv.Itoa(i),
			"--initial-cluster", strings.Join(peers, ","), "--client-url", c.urls[i], "--peer-url", fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		wg.Add(1)
		go func() { // returns once the member serves or failed to start
			defer wg.Done()
			c.members[i], errs[i] = startChild(ctx, lockd, args, etcdServingLine)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("start a %d-member etcd: %w", scaleMembers, err)
	}
	if c.cli, err = clientv3.New(etcdstore.ClientConfig(c.urls, dialTimeout)); err != nil {
		return c, fmt.Errorf("connect to the %d-member etcd: %w", scaleMembers, err)
	}
	return c, nil
}

// stop closes the client and stops every member.
func (c *scaleCluster) stop() {
	if c.cli != nil {
		_ = c.cli.Close()
	}
	for _, m := range c.members {
		if m != nil {
			m.stop()
		}
	}
}

// leader returns the index of the member every member names as leader.
func (c *scaleCluster) leader(ctx context.Context) (int, error) {
	ids := make([]uint64, len(c.urls))
	var lead uint64
	for i, u := range c.urls {
		sctx, cancel := context.WithTimeout(ctx, dialTimeout)
		st, err := c.cli.Status(sctx, u)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("etcd status of %s: %w", u, err)
		}
		if i > 0 && st.Leader != lead {
			return 0, fmt.Errorf("the etcd members disagree on the leader (%x, %x)", lead, st.Leader)
		}
		ids[i], lead = st.Header.MemberId, st.Leader
	}
	if i := slices.Index(ids, lead); i >= 0 && lead != 0 {
		return i, nil
	}
	return 0, fmt.Errorf("no etcd member is the leader (%x) its members name", lead)
}

// scalePoint is what one point of the scale scenario measured.
type scalePoint struct {
	leader, followers, replicas, client Value
	alive                               int
}

// scale measures every point of Config.ScaleSessions × ScaleReplicas on a
// cluster of its own, stopped at the end.
func (r *runner) scale(ctx context.Context) ([]Row, error) {
	cfg := r.cfg
	dir, err := os.MkdirTemp("", "lockd-bench-scale-")
	if err != nil {
		return nil, fmt.Errorf("scale: data dir: %w", err)
	}
	defer os.RemoveAll(dir)
	r.progressf("scale: starting a %d-member etcd", scaleMembers)
	cl, err := startScaleCluster(ctx, cfg.LockdCommand, dir)
	if err != nil {
		return nil, fmt.Errorf("scale: %w", err)
	}
	defer cl.stop()
	var rows []Row
	for _, reps := range cfg.ScaleReplicas {
		var ns, leads, locks []Value
		for _, n := range cfg.ScaleSessions {
			p, err := r.scalePoint(ctx, cl, n, reps)
			if err != nil {
				return rows, fmt.Errorf("scale: %d sessions on %d replicas: %w", n, reps, err)
			}
			per := Value(n) / 1000
			add := func(metric string, v Value) {
				rows = append(rows, Row{Scenario: scScale, N: n, Replicas: reps, Metric: metric, Lockd: v, Note: scaleNote})
			}
			add(MetricLeaderCPU, p.leader)
			add(MetricFollowersCPU, p.followers)
			add(MetricReplicasCPU, p.replicas)
			add(MetricClientCPU, p.client)
			add(MetricLeaderCPUPer1000, p.leader/per)
			add(MetricReplicasCPUPer1000, p.replicas/per)
			add(MetricAlive, Value(p.alive))
			lockdAtLeast(&rows[len(rows)-1], float64(n))
			ns, leads, locks = append(ns, per), append(leads, p.leader), append(locks, p.replicas)
		}
		if s := slope(ns, leads); !math.IsNaN(float64(s)) {
			rows = append(rows, Row{Scenario: scScale, Replicas: reps, Metric: MetricLeaderSlope, Lockd: s, Note: scaleNote},
				Row{Scenario: scScale, Replicas: reps, Metric: MetricReplicasSlope, Lockd: slope(ns, locks), Note: scaleNote})
		}
	}
	return rows, nil
}

// slope is the least-squares slope of ys against xs; NaN with fewer than
// two distinct xs.
func slope(xs, ys []Value) Value {
	var mx, my Value
	for i := range xs {
		mx, my = mx+xs[i], my+ys[i]
	}
	mx, my = mx/Value(len(xs)), my/Value(len(xs))
	var sxy, sxx Value
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if len(xs) < 2 || sxx == 0 {
		return Value(math.NaN())
	}
	return sxy / sxx
}

// scalePoint measures n idle sessions on reps replicas over cl.
func (r *runner) scalePoint(ctx context.Context, cl *scaleCluster, n, reps int) (p scalePoint, err error) {
	cfg := r.cfg
	prefix := fmt.Sprintf("%s%s/%d-%d/", etcdScalePrefix, r.bed.run, reps, n)
	defer func() { // the point's keys, after its replicas stopped (deferred first, runs last)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if _, derr := cl.cli.Delete(dctx, prefix, clientv3.WithPrefix()); derr != nil && err == nil {
			err = fmt.Errorf("delete %s: %w", prefix, derr)
		}
	}()
	args := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--session-ttl", sessionTTL.String(),
		"--max-sessions", strconv.Itoa(max(server.DefaultConfig().MaxSessions, n)),
		"--backend", BackendEtcd, "--etcd-endpoints", strings.Join(cl.urls, ","), "--etcd-prefix", prefix}
	replicas := make([]*child, reps)
	defer func() {
		for _, k := range replicas {
			if k != nil {
				k.stop()
			}
		}
	}()
	for i := range replicas {
		if replicas[i], err = startChild(ctx, cfg.LockdCommand, args, servingLine); err != nil {
			return p, err
		}
	}
	clients := make([]*client.Client, max(reps, (n+sessionsPerClient-1)/sessionsPerClient))
	defer closeClients(clients) // before the replicas stop: close the sessions while they serve
	for i := range clients {
		if clients[i], err = client.New(replicas[i%reps].addr); err != nil {
			return p, fmt.Errorf("client: %w", err)
		}
	}
	r.progressf("scale: opening %d sessions on %d replicas", n, reps)
	sessions := make([]*client.Session, n)
	opened := time.Now()
	err = parallel(ctx, n, setupWidth, func(ctx context.Context, i int) error {
		s, err := clients[i%len(clients)].NewSession(ctx)
		sessions[i] = s
		return err
	})
	if err != nil {
		return p, fmt.Errorf("open %d sessions: %w", n, err)
	}
	r.progressf("scale: %d sessions open after %v; settling %v, measuring %v", n, time.Since(opened).Round(time.Millisecond),
		settleFor(cfg.ScaleDuration), cfg.ScaleDuration)
	lead, err := cl.leader(ctx)
	if err != nil {
		return p, err
	}
	var leader, followers, lockd cpuMeter
	for i, m := range cl.members {
		if i == lead {
			leader = append(leader, m.pid())
		} else {
			followers = append(followers, m.pid())
		}
	}
	for _, k := range replicas {
		lockd = append(lockd, k.pid())
	}
	pcts, clientPct, err := measureIdle(ctx, cfg.ScaleDuration, leader, followers, lockd)
	if err != nil {
		return p, err
	}
	if after, err := cl.leader(ctx); err != nil {
		return p, err
	} else if after != lead {
		return p, fmt.Errorf("the etcd leader moved from member %d to %d during the window: not measured", lead, after)
	}
	p.leader, p.followers, p.replicas, p.client = pcts[0], pcts[1], pcts[2], clientPct
	for _, s := range sessions {
		if s.Err() == nil {
			p.alive++
		}
	}
	if math.IsNaN(float64(p.leader)) || math.IsNaN(float64(p.replicas)) {
		return p, errors.New("cpu not measurable")
	}
	r.progressf("scale: %d sessions, %d replicas: etcd leader %s%% of a core, followers %s%%, lockd %s%%, clients %s%%, %d alive",
		n, reps, p.leader, p.followers, p.replicas, p.client, p.alive)
	return p, nil
}
