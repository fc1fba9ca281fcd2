package lockdtest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// exampleServer is the lockd of ExampleAddr, shared by a test binary's
// Example functions and stopped by Main.
var exampleServer struct {
	mu     sync.Mutex
	srv    *server.Server
	st     store.LockStore
	served chan error
	addr   string
	err    error
}

// ExampleAddr returns the address of a lockd server over the shared
// embedded etcd, for runnable Example functions (which get no *testing.T).
// It is started on first use and stopped by Main. It panics if the server
// cannot be started.
func ExampleAddr() string {
	exampleServer.mu.Lock()
	defer exampleServer.mu.Unlock()
	if exampleServer.srv == nil && exampleServer.err == nil {
		exampleServer.err = startExampleServer()
	}
	if exampleServer.err != nil {
		panic(fmt.Sprintf("lockdtest: example server: %v", exampleServer.err))
	}
	return exampleServer.addr
}

func startExampleServer() error {
	eps, err := etcdtest.SharedEndpoints()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &Namespace{backend: backend.Etcd, etcdNS: "/lockdtest/examples/"}
	st, err := backend.Open(ctx, ns.config(eps), nil, nil)
	if err != nil {
		return err
	}
	srv, err := server.New(Config(), st, server.Options{BackendLabel: st.Label()})
	if err != nil {
		st.Close()
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Shutdown(ctx)
		st.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }() // exits after Shutdown (stopExampleServer)
	exampleServer.srv, exampleServer.st, exampleServer.served, exampleServer.addr = srv, st, served, lis.Addr().String()
	return nil
}

func stopExampleServer() {
	exampleServer.mu.Lock()
	defer exampleServer.mu.Unlock()
	if exampleServer.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = exampleServer.srv.Shutdown(ctx)
	<-exampleServer.served
	_ = exampleServer.st.Close()
	exampleServer.srv = nil
}
