package bench

import (
	"context"
	"fmt"
)

// sysLockdNoStats is lockd with lock.server.stats.enabled false (C5
// #ct5-stats): a second `lockd serve` child over the same backend and
// namespace as lockd's, measured in distinct and contended as one more
// baseline when Config.StatsOffRows is set (issue 27: the cost of the
// per-template statistics and the hot keys). LOCKD/RAW of its rows is
// lockd with statistics over lockd without.
const sysLockdNoStats = "lockd-nostats"

// statsOffNote explains the lockd-nostats rows in the report.
const statsOffNote = "lockd-nostats: a second `lockd serve` child over the same backend and namespace with --stats-enabled=false " +
	"(no per-template statistics, no hot keys; C5 #ct5-stats), its own keys; LOCKD/RAW of its rows = lockd (statistics on, the " +
	"default) over lockd-nostats: the statistics' cost is 1 - LOCKD/RAW for pairs/s and hand-overs/s"

// startLockdNoStats starts the lockd-nostats server (a `lockd serve` child
// as startLockdProcess's, with --stats-enabled=false) and adds its system
// to distinct and contended, after the others (so that each round runs it
// right before lockd, the order rotating).
func (b *bed) startLockdNoStats(ctx context.Context, cfg Config, lockdPrefix string, maxLocks int) error {
	ch, err := b.startServe(ctx, cfg, lockdPrefix, maxLocks, "--stats-enabled=false")
	if err != nil {
		return fmt.Errorf("start lockd's server without statistics: %w", err)
	}
	b.noStatsProc = ch
	b.systems = append(b.systems, &lockdSystem{label: sysLockdNoStats})
	return nil
}
