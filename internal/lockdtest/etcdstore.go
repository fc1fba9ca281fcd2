package lockdtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/etcdtest"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
)

// openEtcdStore opens an etcdstore instance, with a client of its own, under
// prefix on the shared embedded etcd.
func openEtcdStore(ctx context.Context, t testing.TB, prefix string, opts StoreOptions) (store.LockStore, error) {
	t.Helper()
	eps, err := etcdEndpoints()
	if err != nil {
		return nil, err
	}
	return newEtcdStore(ctx, eps, prefix, opts)
}

func newEtcdStore(ctx context.Context, endpoints []string, prefix string, opts StoreOptions) (store.LockStore, error) {
	cli, err := clientv3.New(etcdtest.ClientConfig(endpoints))
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	st, err := etcdstore.New(ctx, cli, etcdstore.Options{Prefix: prefix, Logger: opts.Logger, Metrics: opts.Metrics})
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &etcdOwned{Store: st, cli: cli}, nil
}

// etcdOwned is an etcdstore.Store that also owns its etcd client.
type etcdOwned struct {
	*etcdstore.Store
	cli  *clientv3.Client
	once sync.Once
	err  error
}

// Close closes the store, then its client. It is idempotent.
func (s *etcdOwned) Close() error {
	s.once.Do(func() { s.err = errors.Join(s.Store.Close(), s.cli.Close()) })
	return s.err
}
