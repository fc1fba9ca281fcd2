package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"lock.dev/lockd/internal/telemetry"
)

// Storage upkeep (C5 #ct5-storage): a goroutine of the Server compacts the
// history by revision count and recovers from the NOSPACE alarm. etcd's own
// periodic compactor still drops history older than an hour.

const (
	// DefaultCompactionInterval is how often the history is compacted to
	// the current revision minus Config.CompactionRetainRevisions.
	DefaultCompactionInterval = 10 * time.Second
	// alarmCheckInterval is how often the alarms are read (from the
	// server's memory, no request).
	alarmCheckInterval = 250 * time.Millisecond
	// upkeepTimeout bounds one compaction, defragmentation or disarm.
	upkeepTimeout = time.Minute
)

// upkeep owns the storage upkeep goroutine of one Server.
type upkeep struct {
	e        *embed.Etcd
	cli      *clientv3.Client // in-process (v3client): no network
	log      telemetry.Log
	retain   int64
	interval time.Duration
	quota    int64

	compacted int64 // the last revision compacted to (by the upkeep)

	cancel context.CancelFunc
	done   chan struct{}
}

// startUpkeep starts the upkeep goroutine; stop ends it.
func startUpkeep(e *embed.Etcd, cfg Config) *upkeep {
	ctx, cancel := context.WithCancel(context.Background())
	u := &upkeep{
		e:        e,
		cli:      v3client.New(e.Server),
		log:      telemetry.Log{L: cfg.Logger, Backend: "etcd"},
		retain:   cfg.CompactionRetainRevisions,
		interval: cfg.CompactionInterval,
		quota:    quotaOf(e),
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	if u.interval <= 0 {
		u.interval = DefaultCompactionInterval
	}
	go u.run(ctx) // exits when stop cancels ctx
	return u
}

// quotaOf is the quota the server applies: etcd's default for 0.
func quotaOf(e *embed.Etcd) int64 {
	if q := e.Config().QuotaBackendBytes; q > 0 {
		return q
	}
	return 2 << 30 // etcd's DefaultQuotaBytes
}

// stop ends the upkeep goroutine and waits for it.
func (u *upkeep) stop() {
	u.cancel()
	<-u.done
	u.cli.Close()
}

func (u *upkeep) run(ctx context.Context) {
	defer close(u.done)
	alarms := time.NewTicker(alarmCheckInterval)
	defer alarms.Stop()
	compact := time.NewTicker(u.interval)
	defer compact.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-alarms.C:
			if u.noSpace() {
				u.recoverSpace(ctx)
			}
		case <-compact.C:
			u.tick(ctx)
		}
	}
}

// tick is one periodic check. Space comes before history: above half the
// quota in use it compacts to the current revision; otherwise to the
// current revision minus retain. A database file above 80 % of the quota
// that is less than half in use is defragmented before etcd refuses writes.
func (u *upkeep) tick(ctx context.Context) {
	be := u.e.Server.Backend()
	rev := u.e.Server.KV().Rev()
	target := int64(0)
	switch {
	case u.quota > 0 && be.SizeInUse() > u.quota/2:
		target = rev
	case u.retain > 0:
		target = rev - u.retain
	}
	if target > u.compacted {
		if err := u.compact(ctx, target, true); err != nil {
			return // tried again at the next tick
		}
	}
	if size := be.Size(); u.quota > 0 && size > u.quota/5*4 && be.SizeInUse() < size/2 {
		u.e.Server.Defragment() //nolint:errcheck // tried again at the next tick
	}
}

// noSpace reports whether the NOSPACE alarm is raised.
func (u *upkeep) noSpace() bool {
	for _, a := range u.e.Server.Alarms() {
		if a.Alarm == pb.AlarmType_NOSPACE {
			return true
		}
	}
	return false
}

// compact compacts the history up to rev; physical waits until the space
// is free for reuse. A revision already compacted is not an error.
func (u *upkeep) compact(ctx context.Context, rev int64, physical bool) error {
	cctx, cancel := context.WithTimeout(ctx, upkeepTimeout)
	defer cancel()
	var opts []clientv3.CompactOption
	if physical {
		opts = append(opts, clientv3.WithCompactPhysical())
	}
	_, err := u.cli.Compact(cctx, rev, opts...)
	if err != nil && !errors.Is(rpctypes.Error(err), rpctypes.ErrCompacted) {
		return fmt.Errorf("embedetcd: compact to %d: %w", rev, err)
	}
	u.compacted = max(u.compacted, rev)
	u.log.BackendCompacted(rev)
	return nil
}

// recoverSpace handles the NOSPACE alarm: compact everything but the
// current revision, defragment (which gives the freed space back, so the
// database file is below the quota again) and disarm the alarm. Writes fail
// until then. A failed step is tried again at the next alarm check.
func (u *upkeep) recoverSpace(ctx context.Context) {
	be := u.e.Server.Backend()
	u.log.BackendSpaceExhausted(be.Size(), u.quota)
	rev := u.e.Server.KV().Rev()
	if err := u.compact(ctx, rev, true); err != nil {
		return
	}
	// The server's own Defragment: v3client's maintenance client has no
	// health notifier and cannot defragment.
	if err := u.e.Server.Defragment(); err != nil {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, upkeepTimeout)
	defer cancel()
	if _, err := u.cli.AlarmDisarm(dctx, &clientv3.AlarmMember{
		MemberID: uint64(u.e.Server.MemberID()), Alarm: pb.AlarmType_NOSPACE,
	}); err != nil {
		return
	}
	u.log.BackendSpaceRecovered(be.Size(), rev)
}
