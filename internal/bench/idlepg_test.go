package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestPGSession runs pg-session, the idle scenario's raw PostgreSQL
// baseline, on a real PostgreSQL at a 2 s TTL (heartbeat every 667 ms)
// for a 2 s window after a 500 ms settle: longer than the TTL, so a
// session nobody renews expires within it. Kept alive, every session is
// alive at the end, heartbeats were committed and the CPU of the
// PostgreSQL backend serving the connection (its UPDATEs and the reaper's
// DELETEs fall in the window) and of this process are positive and
// finite. The control: the same run without heartbeats is refused (its
// sessions expired), so the liveness check is what makes a figure count.
func TestPGSession(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	const n = 5
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "kept", false: "control-not-kept"}[keep], func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, time.Minute)
			schema := map[bool]string{true: "kept", false: "notkept"}[keep]
			p := pgIdle{dsn: dsn, schema: schema, n: n, ttl: 2 * time.Second, keepAlive: keep}
			f, beats, err := p.run(ctx, 2*time.Second, t.Logf)
			if !keep {
				if err == nil || !strings.Contains(err.Error(), "not kept alive") || f.alive != 0 {
					t.Fatalf("pg-session without heartbeats: %v, %d of %d alive; want it refused as not kept alive, none alive", err, f.alive, n)
				}
				return
			}
			if err != nil {
				t.Fatalf("pg-session: %v", err)
			}
			finite := func(v Value) bool { return v > 0 && !math.IsInf(float64(v), 0) && !math.IsNaN(float64(v)) }
			if f.alive != n || beats < 1 || !finite(f.server) || f.backend != f.server || !finite(f.client) {
				t.Errorf("pg-session: %d of %d alive, %d heartbeats, server cpu %v%% (backend %v%%), client cpu %v%%; "+
					"want all alive, a heartbeat, positive finite cpu, the server all backend", f.alive, n, beats, f.server, f.backend, f.client)
			}
		})
	}
}
