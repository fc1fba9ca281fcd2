package fenced

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/fence/fencepg"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/test/chaos/history"
)

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, nil) }

func start(t *testing.T, check bool) (*Server, *Client) {
	t.Helper()
	return startCfg(t, Config{CheckTokens: check})
}

// pgFence returns a pool on a fresh database with the shipped PostgreSQL
// fence applied (fence/fencepg).
func pgFence(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := testCtx(t)
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := fencepg.Apply(ctx, pool); err != nil {
		t.Fatalf("fencepg.Apply: %v", err)
	}
	return pool
}

func startCfg(t *testing.T, cfg Config) (*Server, *Client) {
	t.Helper()
	s, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c := NewClient(s.URL())
	t.Cleanup(func() {
		c.Close()
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCheckTokensRefusesStale(t *testing.T) {
	t.Parallel()
	for _, pg := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "fencepg"}[pg], func(t *testing.T) {
			t.Parallel()
			cfg := Config{CheckTokens: true}
			if pg {
				cfg.PGFence = pgFence(t)
			}
			checkTokensRefusesStale(t, cfg)
		})
	}
}

func checkTokensRefusesStale(t *testing.T, cfg Config) {
	s, c := startCfg(t, cfg)
	ctx := testCtx(t)
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL() = %s, want a loopback address", s.URL())
	}
	steps := []struct {
		key, writer string
		token       uint64
		stale       bool
	}{
		{"k", "a", 5, false},
		{"k", "a", 5, false}, // equal token: the same holder writing again
		{"k", "b", 7, false},
		{"k", "a", 5, true},  // superseded holder
		{"j", "a", 1, false}, // keys are independent
		{"k", "b", 7, false},
	}
	for i, st := range steps {
		_, err := c.Write(ctx, st.key, st.writer, st.token)
		if st.stale {
			if !errors.Is(err, ErrStale) || OutcomeOf(err) != history.Fail {
				t.Fatalf("step %d Write(%s,%s,%d) = %v, want ErrStale (outcome fail)", i, st.key, st.writer, st.token, err)
			}
			continue
		}
		if err != nil || OutcomeOf(err) != history.OK {
			t.Fatalf("step %d Write(%s,%s,%d) = %v, want accepted", i, st.key, st.writer, st.token, err)
		}
	}
	ws := s.Writes()
	var got []string
	for i, w := range ws {
		if w.Seq != uint64(i+1) {
			t.Fatalf("write %d has seq %d, want %d", i, w.Seq, i+1)
		}
		if i > 0 && w.At < ws[i-1].At {
			t.Fatalf("write %d at %d before write %d at %d", i, w.At, i-1, ws[i-1].At)
		}
		got = append(got, fmt.Sprintf("%s/%s/%d", w.Key, w.Writer, w.Token))
	}
	if g, want := strings.Join(got, " "), "k/a/5 k/a/5 k/b/7 j/a/1 k/b/7"; g != want {
		t.Fatalf("Writes() = %s, want %s", g, want)
	}
	if r := s.Rejected(); r != 1 {
		t.Fatalf("Rejected() = %d, want 1", r)
	}
	if r, want := s.RejectedByPG(), map[bool]int{false: 0, true: 1}[cfg.PGFence != nil]; r != want {
		t.Fatalf("RejectedByPG() = %d, want %d", r, want)
	}
	remote, err := c.Writes(ctx)
	if err != nil {
		t.Fatalf("client Writes: %v", err)
	}
	if len(remote) != len(ws) || remote[2] != ws[2] {
		t.Fatalf("GET /writes = %v, want %v", remote, ws)
	}
}

// The control: with the check off a superseded holder's write goes through.
func TestCheckOffAcceptsEverything(t *testing.T) {
	t.Parallel()
	s, c := start(t, false)
	ctx := testCtx(t)
	for _, tok := range []uint64{9, 3, 1, 9} {
		if _, err := c.Write(ctx, "k", fmt.Sprint("w", tok), tok); err != nil {
			t.Fatalf("Write token %d with checks off = %v, want accepted", tok, err)
		}
	}
	if n, r := len(s.Writes()), s.Rejected(); n != 4 || r != 0 || s.CheckTokens() {
		t.Fatalf("check off: %d writes, %d rejected, CheckTokens %v; want 4, 0, false", n, r, s.CheckTokens())
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	s, c := start(t, true)
	ctx := testCtx(t)
	if _, err := c.Write(ctx, "", "a", 1); !errors.Is(err, ErrBadRequest) || OutcomeOf(err) != history.Fail {
		t.Fatalf("Write with empty key = %v, want ErrBadRequest", err)
	}
	if _, err := c.Write(ctx, "k", "", 1); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Write with empty writer = %v, want ErrBadRequest", err)
	}
	resp, err := http.Post(s.URL()+"/write", "application/json", strings.NewReader(`{"key":"k","writer":"a","token":1,"x":2}`))
	if err != nil {
		t.Fatalf("POST unknown field: %v", err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("POST with an unknown field: status %d, want 400", resp.StatusCode)
	}
	if n := len(s.Writes()); n != 0 {
		t.Fatalf("bad requests recorded %d writes, want 0", n)
	}
}

// Concurrent writers racing with rising tokens: every accepted write carries
// a token at least the highest accepted before it, per key.
func TestConcurrentWritersKeepOrder(t *testing.T) {
	t.Parallel()
	s, c := start(t, true)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range 40 {
				tok := uint64(i*6 + w + 1)
				_, err := c.Write(ctx, fmt.Sprint("k", w%2), fmt.Sprint("w", w), tok)
				if err != nil && OutcomeOf(err) != history.Fail {
					t.Errorf("Write: %v", err)
				}
			}
		})
	}
	wg.Wait()
	high := map[string]uint64{}
	for _, w := range s.Writes() {
		if w.Token < high[w.Key] {
			t.Fatalf("accepted %+v after token %d on the same key", w, high[w.Key])
		}
		high[w.Key] = w.Token
	}
	if got := len(s.Writes()) + s.Rejected(); got != 6*40 {
		t.Fatalf("accepted+rejected = %d, want %d", got, 6*40)
	}
}

func TestWriteAfterCloseIsUnknown(t *testing.T) {
	t.Parallel()
	s, err := Start(Config{CheckTokens: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c := NewClient(s.URL())
	defer c.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = c.Write(testCtx(t), "k", "a", 1)
	if err == nil || OutcomeOf(err) != history.Unknown {
		t.Fatalf("Write to a closed server = %v (outcome %s), want a transport error classified unknown", err, OutcomeOf(err))
	}
}

// The read/write rules: readers are refused once a later writer has
// written, writers once any later grant has; readers do not refuse each
// other. Slots are checked against the holders SlotHolders reports.
func TestModes(t *testing.T) {
	t.Parallel()
	holders := map[string][]uint64{"s": {3, 9}}
	var mu sync.Mutex
	s, err := Start(Config{CheckTokens: true, SlotHolders: func(_ context.Context, key string) ([]uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		if key == "broken" {
			return nil, errors.New("lockd unreachable")
		}
		return holders[key], nil
	}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c := NewClient(s.URL())
	t.Cleanup(func() {
		c.Close()
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx := testCtx(t)
	steps := []struct {
		key, writer, mode string
		token             uint64
		want              history.Outcome
	}{
		{"rw", "r1", ModeShared, 10, history.OK},
		{"rw", "r2", ModeShared, 12, history.OK},
		{"rw", "r1", ModeShared, 10, history.OK}, // readers together
		{"rw", "w", ModeExclusive, 20, history.OK},
		{"rw", "r2", ModeShared, 12, history.Fail}, // superseded by the writer
		{"rw", "r3", ModeShared, 25, history.OK},
		{"rw", "w", ModeExclusive, 20, history.Fail}, // superseded by a later reader
		{"rw", "w2", ModeExclusive, 30, history.OK},
		{"rw", "r3", ModeShared, 25, history.Fail},
		{"s", "a", ModeSlot, 3, history.OK},
		{"s", "b", ModeSlot, 9, history.OK},
		{"s", "c", ModeSlot, 5, history.Fail}, // not a holder (any more)
		{"broken", "a", ModeSlot, 1, history.Unknown},
		{"rw", "x", "bogus", 99, history.Fail},
	}
	for i, st := range steps {
		_, err := c.WriteMode(ctx, st.key, st.writer, st.mode, st.token)
		if got := OutcomeOf(err); got != st.want {
			t.Fatalf("step %d WriteMode(%s,%s,%s,%d) = %v (%s), want %s", i, st.key, st.writer, st.mode, st.token, err, got, st.want)
		}
	}
	if n, r := len(s.Writes()), s.Rejected(); n != 8 || r != 4 {
		t.Fatalf("%d writes accepted, %d refused; want 8, 4", n, r)
	}
	if w := s.Writes()[3]; w.Mode != ModeExclusive || w.Token != 20 {
		t.Fatalf("write 4 = %+v, want the exclusive one with token 20", w)
	}

	// The control: with the check off every mode is accepted and no holder
	// is asked.
	off, err := Start(Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer off.Close()
	for _, st := range steps[:len(steps)-1] {
		if _, _, ok, err := off.AcceptMode(st.key, st.writer, st.mode, st.token); !ok || err != nil {
			t.Fatalf("check off: AcceptMode(%+v) = %v, %v; want accepted", st, ok, err)
		}
	}
}

// TestSlotCheck: with SlotCheck set, a slot write is accepted iff SlotCheck
// says its token is current (SlotHolders is not asked), and a failing
// check is an error, never an acceptance.
func TestSlotCheck(t *testing.T) {
	t.Parallel()
	current := map[uint64]bool{7: true}
	s, c := startCfg(t, Config{CheckTokens: true,
		SlotHolders: func(context.Context, string) ([]uint64, error) { return nil, errors.New("SlotHolders asked") },
		SlotCheck: func(_ context.Context, key string, token uint64) (bool, error) {
			if key == "down" {
				return false, errors.New("lockd unreachable")
			}
			return current[token], nil
		}})
	ctx := testCtx(t)
	if _, err := c.WriteMode(ctx, "sem", "a", ModeSlot, 7); err != nil {
		t.Fatalf("slot write with a current token: %v", err)
	}
	if _, err := c.WriteMode(ctx, "sem", "b", ModeSlot, 5); !errors.Is(err, ErrStale) {
		t.Fatalf("slot write with a token that is not current = %v; want ErrStale", err)
	}
	if _, err := c.WriteMode(ctx, "down", "a", ModeSlot, 7); err == nil || OutcomeOf(err) != history.Unknown {
		t.Fatalf("slot write with the check failing = %v; want an unknown outcome", err)
	}
	if n := len(s.Writes()); n != 1 {
		t.Fatalf("%d writes accepted; want 1", n)
	}
}
