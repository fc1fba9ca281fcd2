package cli

import (
	"net"
	"os"
	"strings"
	"testing"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestServerList: --server and LOCKD_SERVER take several replicas
// (a,b,c); a client command uses one that answers (the first here refuses
// connections), C2 #ct2-failover. PostgreSQL only: two replicas share its
// sessions (add etcd once its sessions are adoptable, issue 13).
func TestServerList(t *testing.T) {
	t.Parallel()
	ns := lockdtest.NewNamespace(t, backend.PG)
	a := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true})
	b := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true})
	dead := deadAddr(t)
	env := []string{"PATH=" + os.Getenv("PATH")}

	list := dead + "," + a.Addr + "," + b.Addr
	if res := lockd(t, env, "run", "--server", list, "jobs/x", "--", "sh", "-c", "echo token $LOCKD_FENCING_TOKEN"); res.code != 0 || !strings.Contains(res.stdout, "token ") {
		t.Fatalf("run --server %s: %v; want exit 0 and the command's output", list, res)
	}
	withEnv := append(env, EnvServer+"="+dead+", "+b.Addr)
	if res := lockd(t, withEnv, "inspect", "jobs/x"); res.code != 0 || !strings.Contains(res.stdout, "held:      no\n") {
		t.Fatalf("inspect with %s=%s,%s: %v; want the free key", EnvServer, dead, b.Addr, res)
	}
	if res := lockd(t, env, "inspect", "--server", "a:1,nonsense", "jobs/x"); res.code == 0 || !strings.Contains(res.stderr, "nonsense") {
		t.Fatalf("inspect --server a:1,nonsense: %v; want an error naming the bad address", res)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
