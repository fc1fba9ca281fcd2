package etcdtest

import (
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
)

// NewProxy starts a fault proxy (testkit.Proxy) to the shared server, closed
// when the test ends. Clients dial ProxyEndpoint(p).
func NewProxy(t testing.TB) *testkit.Proxy {
	t.Helper()
	return testkit.NewProxy(t, strings.TrimPrefix(Endpoints(t)[0], "http://"))
}

// ProxyEndpoint is the URL clients dial to reach the server through p.
func ProxyEndpoint(p *testkit.Proxy) string { return "http://" + p.Addr() }
