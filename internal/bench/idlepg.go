package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/store/pgstore"
)

// sysPGSession is the idle scenario's raw PostgreSQL baseline (issue 24):
// N sessions as rows of one table with an expiry, kept alive by one
// batched UPDATE per heartbeat interval from one client connection, and a
// reaper deleting the expired rows every second on the same connection.
const sysPGSession = "pg-session"

// Application names (pg_stat_activity.application_name) by which the idle
// scenario finds the PostgreSQL backend processes serving each system: the
// lockd child gets its name through PGAPPNAME, pg-session sets its own.
const (
	appLockdIdle = "lockd-bench-idle"
	appPGSession = "lockd-bench-pg-session"
)

// MetricBackendCPU is the idle scenario's backend share of the server
// CPU: the etcd process the bench started, or the PostgreSQL backend
// processes serving the system's connections.
const MetricBackendCPU = "backend cpu % of a core"

// pgIdle is pg-session: the idle sessions a careful engineer would keep on
// PostgreSQL without lockd. One table in schema (id bigint primary key,
// expires_at timestamptz, an index on expires_at for the reaper, as
// lockd's own sessions table has), n rows opened in one INSERT, and one
// client connection that every heartbeat interval (ttl/3, lockd's
// default) renews all n rows in one UPDATE … WHERE id = ANY($1) AND
// expires_at > now() (an expired row is never revived, as lockd's
// heartbeat batch), and every reaperInterval (lockd's
// lock.pg.reaper-interval default) deletes the expired rows.
type pgIdle struct {
	dsn    string
	schema string
	n      int
	ttl    time.Duration
	// keepAlive false leaves the rows unrenewed: the control of the
	// liveness check (TestPGSessionRefusedWhenNotKeptAlive).
	keepAlive bool
}

// pgIdleTable is pg-session's table in its schema.
const pgIdleTable = "idle_sessions"

// run opens the sessions, keeps them alive, measures (measureIdle's settle
// and window of d) the CPU of the PostgreSQL backend serving the
// connection (NaN when that process is not on this machine) and of this
// process, and refuses the measurement unless every session is still
// alive at its end. beats is the number of heartbeat UPDATEs committed.
func (p pgIdle) run(ctx context.Context, d time.Duration, progressf func(string, ...any)) (f idleFigures, beats int, err error) {
	cc, err := pgx.ParseConfig(p.dsn)
	if err != nil {
		return f, 0, fmt.Errorf("pg-session: %w", err)
	}
	cc.RuntimeParams["application_name"] = appPGSession
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return f, 0, fmt.Errorf("pg-session: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	table := pgx.Identifier{p.schema, pgIdleTable}.Sanitize()
	for _, ddl := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{p.schema}.Sanitize(),
		"DROP TABLE IF EXISTS " + table,
		"CREATE TABLE " + table + " (id bigint PRIMARY KEY, expires_at timestamptz NOT NULL)",
		"CREATE INDEX ON " + table + " (expires_at)",
	} {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return f, 0, fmt.Errorf("pg-session: schema: %w", err)
		}
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+table) }()
	ids := make([]int64, p.n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	ttlMs := p.ttl.Milliseconds()
	opened := time.Now()
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" (id, expires_at) SELECT id, now() + $2::bigint * interval '1 millisecond' FROM unnest($1::bigint[]) id",
		ids, ttlMs); err != nil {
		return f, 0, fmt.Errorf("pg-session: open %d sessions: %w", p.n, err)
	}
	progressf("idle: %d pg-session rows open after %v", p.n, time.Since(opened).Round(time.Millisecond))
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return f, 0, fmt.Errorf("pg-session: %w", err)
	}
	var server cpuMeter
	if localPostgres(pid) {
		server = cpuMeter{pid}
	}

	// The client: heartbeats and the reaper, one goroutine on the one
	// connection (a pgx.Conn serves one statement at a time).
	kctx, stop := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		keptErr error
	)
	wg.Add(1)
	go func() { // stopped by stop(), waited for below
		defer wg.Done()
		beats, keptErr = p.keep(kctx, conn, table, ids)
	}()
	stopKeeper := func() error {
		stop()
		wg.Wait()
		if keptErr != nil && !errors.Is(keptErr, context.Canceled) {
			return keptErr
		}
		return nil
	}
	pcts, client, err := measureIdle(ctx, d, server)
	if kerr := stopKeeper(); err == nil {
		err = kerr
	}
	if err != nil {
		return f, beats, fmt.Errorf("pg-session: %w", err)
	}
	f.server, f.backend, f.client = pcts[0], pcts[0], client
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE expires_at > now()").Scan(&f.alive); err != nil {
		return f, beats, fmt.Errorf("pg-session: count live sessions: %w", err)
	}
	if f.alive < p.n {
		return f, beats, fmt.Errorf("pg-session: %d of %d sessions expired while idle (%d heartbeat UPDATEs): not kept alive, not measured",
			p.n-f.alive, p.n, beats)
	}
	return f, beats, nil
}

// keep renews every row each ttl/3 (one UPDATE) and deletes expired rows
// each reaper interval until ctx ends; it returns the number of heartbeat
// UPDATEs, and an error when one of them renewed fewer rows than it
// should (a session lost) or a statement failed.
func (p pgIdle) keep(ctx context.Context, conn *pgx.Conn, table string, ids []int64) (beats int, err error) {
	beat := time.NewTicker(p.ttl / 3)
	defer beat.Stop()
	reap := time.NewTicker(pgstore.DefaultReaperInterval)
	defer reap.Stop()
	ttlMs := p.ttl.Milliseconds()
	heartbeat := "UPDATE " + table + " SET expires_at = now() + $2::bigint * interval '1 millisecond' WHERE id = ANY($1::bigint[]) AND expires_at > now()"
	reaper := "DELETE FROM " + table + " WHERE expires_at < now()"
	for {
		select {
		case <-ctx.Done():
			return beats, ctx.Err()
		case <-beat.C:
			if !p.keepAlive {
				continue
			}
			tag, err := conn.Exec(ctx, heartbeat, ids, ttlMs)
			if err != nil {
				return beats, fmt.Errorf("heartbeat: %w", err)
			}
			beats++
			if int(tag.RowsAffected()) != len(ids) {
				return beats, fmt.Errorf("heartbeat %d renewed %d of %d sessions", beats, tag.RowsAffected(), len(ids))
			}
		case <-reap.C:
			if _, err := conn.Exec(ctx, reaper); err != nil {
				return beats, fmt.Errorf("reaper: %w", err)
			}
		}
	}
}

// localPostgres reports whether pid is a PostgreSQL process on this
// machine (in this pid namespace): the server the bench talks to runs
// here, so its backends' CPU can be read from /proc.
func localPostgres(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil || strings.TrimSpace(string(b)) != "postgres" {
		return false
	}
	_, err = procCPU(pid)
	return err == nil
}

// pgBackends returns the PostgreSQL backend processes of the connections
// named app (application_name) to the pool's database, when they run on
// this machine; nil otherwise.
func pgBackends(ctx context.Context, pool *pgxpool.Pool, app string) ([]int, error) {
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()", app)
	if err != nil {
		return nil, fmt.Errorf("find the backends of %s: %w", app, err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("find the backends of %s: %w", app, err)
	}
	var out []int
	for _, pid := range pids {
		if !localPostgres(int(pid)) {
			return nil, nil
		}
		out = append(out, int(pid))
	}
	return out, nil
}

// idleRawPG measures pg-session at the bench's session TTL.
func (r *runner) idleRawPG(ctx context.Context) (idleFigures, error) {
	p := pgIdle{dsn: r.bed.dsn, schema: pgRawSchema, n: r.cfg.IdleSessions, ttl: sessionTTL, keepAlive: true}
	r.progressf("idle: opening %d pg-session rows", p.n)
	f, beats, err := p.run(ctx, r.cfg.IdleDuration, r.progressf)
	if err != nil {
		return f, fmt.Errorf("idle: %w", err)
	}
	r.progressf("idle: pg-session server cpu %s%% of a core, client cpu %s%%, %d heartbeat UPDATEs", f.server, f.client, beats)
	return f, nil
}

// sumPct adds CPU shares, NaN (not measured) counting as nothing; all NaN
// gives NaN.
func sumPct(vs ...Value) Value {
	sum, some := Value(0), false
	for _, v := range vs {
		if !math.IsNaN(float64(v)) {
			sum, some = sum+v, true
		}
	}
	if !some {
		return Value(math.NaN())
	}
	return sum
}
