package bench

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The election scenario's systems: lockd, etcd's concurrency.Election,
// etcd-txn and pg-raw as electors.

// ---- lockd ----

func (s *lockdSystem) candidate(ctx context.Context) (candidate, error) {
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(lockdLocker), nil
}

func (l lockdLocker) campaign(ctx context.Context, election string, value []byte) (uint64, func(context.Context) error, error) {
	lead, err := l.s.Campaign(ctx, election, value)
	if err != nil {
		return 0, nil, err
	}
	return lead.Token(), lead.Resign, nil
}

func (s *lockdSystem) observe(ctx context.Context, election string, seen func(uint64)) error {
	ch, err := s.c.Observe(ctx, election)
	if err != nil {
		return err
	}
	for o := range ch {
		if o.Err != nil {
			return o.Err
		}
		if o.Leader {
			seen(o.Token)
		}
	}
	return nil
}

// ---- etcd concurrency.Election ----

// etcdElectionSystem is etcd's own election recipe.
type etcdElectionSystem struct {
	retrier
	cli    *clientv3.Client
	prefix string
}

func (s *etcdElectionSystem) name() string { return sysEtcdElection }

// candidate grants the session's lease under the client's own context, as
// etcdMutexSystem.open does.
func (s *etcdElectionSystem) candidate(context.Context) (candidate, error) {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(sessionTTL/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("open concurrency session: %w", err)
	}
	return &etcdElectionCandidate{sys: s, sess: sess}, nil
}

type etcdElectionCandidate struct {
	sys  *etcdElectionSystem
	sess *concurrency.Session
}

func (c *etcdElectionCandidate) campaign(ctx context.Context, election string, value []byte) (uint64, func(context.Context) error, error) {
	e := concurrency.NewElection(c.sess, c.sys.prefix+election)
	for {
		err := e.Campaign(ctx, string(value)) // a retry finds its own key from the lost attempt
		if c.sys.retried(ctx, err) {
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		return uint64(e.Rev()), func(ctx context.Context) error {
			for {
				err := e.Resign(ctx)
				if !c.sys.retried(ctx, err) {
					return err
				}
			}
		}, nil
	}
}

func (c *etcdElectionCandidate) close(context.Context) error {
	if err := c.sess.Close(); err != nil {
		return fmt.Errorf("close concurrency session: %w", err)
	}
	return nil
}

// observe follows the election with Election.Observe, which needs a
// session of its own (it campaigns for nothing).
func (s *etcdElectionSystem) observe(ctx context.Context, election string, seen func(uint64)) error {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(sessionTTL/time.Second)))
	if err != nil {
		return fmt.Errorf("open concurrency session: %w", err)
	}
	defer sess.Close()
	for resp := range concurrency.NewElection(sess, s.prefix+election).Observe(ctx) {
		if len(resp.Kvs) > 0 {
			seen(uint64(resp.Kvs[0].CreateRevision))
		}
	}
	if ctx.Err() == nil {
		return errors.New("election observe channel closed")
	}
	return nil
}

// ---- raw etcd ----

func (s *etcdTxnSystem) candidate(ctx context.Context) (candidate, error) {
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(*etcdTxnLocker), nil
}

// campaign is the raw lock with the value in the key.
func (l *etcdTxnLocker) campaign(ctx context.Context, election string, value []byte) (uint64, func(context.Context) error, error) {
	rev, release, err := l.take(ctx, election, string(value))
	return uint64(rev), release, err
}

// observe reads the key, then watches it from the next revision: a put of
// a new key is a new leader (its create revision the id). A broken watch
// reads again.
func (s *etcdTxnSystem) observe(ctx context.Context, election string, seen func(uint64)) error {
	k := s.prefix + election
	for ctx.Err() == nil {
		resp, err := s.cli.Get(ctx, k)
		if s.retried(ctx, err) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read %s: %w", k, err)
		}
		if len(resp.Kvs) > 0 {
			seen(uint64(resp.Kvs[0].CreateRevision))
		}
		wctx, cancel := context.WithCancel(ctx)
		for wr := range s.cli.Watch(wctx, k, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					seen(uint64(ev.Kv.CreateRevision))
				}
			}
		}
		cancel()
	}
	return nil
}

// ---- raw PostgreSQL ----

func (s *pgRawSystem) candidate(ctx context.Context) (candidate, error) {
	if s.minimal {
		return nil, fmt.Errorf("%s has no sessions", s.sysName)
	}
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(*pgRawLocker), nil
}

// campaign is pg-raw's lock on the leaders table, with the value: INSERT …
// ON CONFLICT DO NOTHING, polled every 2–10 ms while the row is taken.
func (l *pgRawLocker) campaign(ctx context.Context, election string, value []byte) (uint64, func(context.Context) error, error) {
	pool := l.pool
	for {
		var token int64
		err := pool.QueryRow(ctx, l.sys.q.campaign, election, l.id, value).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			if err := sleep(ctx, pgPollMin+mrand.N(pgPollMax-pgPollMin)); err != nil {
				return 0, nil, err
			}
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		return uint64(token), func(ctx context.Context) error {
			tag, err := pool.Exec(ctx, l.sys.q.resign, election, token)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("resign %q token %d: no such leader", election, token)
			}
			return err
		}, nil
	}
}

// observe polls the leader's row every 2–10 ms on the bench's own pool.
func (s *pgRawSystem) observe(ctx context.Context, election string, seen func(uint64)) error {
	for {
		var token int64
		err := s.setup.QueryRow(ctx, s.q.leader, election).Scan(&token)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			seen(uint64(token))
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if sleep(ctx, pgPollMin+mrand.N(pgPollMax-pgPollMin)) != nil {
			return nil
		}
	}
}
