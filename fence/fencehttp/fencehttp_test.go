package fencehttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/fence"
	"lock.dev/lockd/fence/fencehttp"
	"lock.dev/lockd/fence/fencepg"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, nil) }

// TestMiddleware: with the memory store and with the PostgreSQL store, the
// holder's token passes (again and again), a newer token passes, the old
// one is 409 with the documented body and never reaches the handler;
// missing headers 428 (or pass with AllowUnfenced), malformed 400, a
// failing store 503.
func TestMiddleware(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := fencepg.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]fence.Store{"memory": fence.NewMemoryStore(), "postgres": fencepg.NewStore(pool)} {
		t.Run(name, func(t *testing.T) {
			handled := 0
			h := fencehttp.Middleware(fencehttp.Options{Store: st, Serialize: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handled++
			}))
			send := func(key string, token string) (int, map[string]string) {
				t.Helper()
				req := httptest.NewRequest("PUT", "/thing", nil)
				if key != "" {
					req.Header.Set(fencehttp.HeaderKey, key)
				}
				if token != "" {
					req.Header.Set(fencehttp.HeaderToken, token)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				var body map[string]string
				if rec.Code != http.StatusOK {
					if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
						t.Fatalf("answer %d body %q: %v", rec.Code, rec.Body, err)
					}
				}
				return rec.Code, body
			}
			for _, tok := range []string{"100", "100", "200"} {
				if code, body := send("jobs%2Fa b", tok); code != http.StatusOK {
					t.Fatalf("token %s: %d %v; want 200", tok, code, body)
				}
			}
			code, body := send("jobs%2Fa b", "150")
			if code != http.StatusConflict || body["error"] != "stale_token" || body["key"] != "jobs/a b" || body["token"] != "150" || body["high_water"] != "200" {
				t.Fatalf("stale token: %d %v; want 409 stale_token with high_water 200", code, body)
			}
			if handled != 3 {
				t.Fatalf("handler ran %d times; want 3 (never for the stale token)", handled)
			}
			if code, body := send("", ""); code != http.StatusPreconditionRequired || body["error"] != "fence_required" {
				t.Fatalf("no headers: %d %v; want 428", code, body)
			}
			for _, bad := range [][2]string{{"k", "x"}, {"k", "0"}, {"k", ""}, {"", "5"}, {"%zz", "5"}, {"k", strconv.FormatUint(1<<63, 10)}} {
				if code, body := send(bad[0], bad[1]); code != http.StatusBadRequest || body["error"] != "bad_fence" {
					t.Fatalf("headers %q: %d %v; want 400", bad, code, body)
				}
			}
		})
	}

	// AllowUnfenced and a failing store.
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	rec := httptest.NewRecorder()
	fencehttp.Middleware(fencehttp.Options{Store: fence.NewMemoryStore(), AllowUnfenced: true})(ok).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("unfenced request with AllowUnfenced: %d; want 200", rec.Code)
	}
	rec = httptest.NewRecorder()
	req := httptest.NewRequest("PUT", "/", nil)
	req.Header.Set(fencehttp.HeaderKey, "k")
	req.Header.Set(fencehttp.HeaderToken, "5")
	fencehttp.Middleware(fencehttp.Options{Store: failing{}})(ok).ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("failing store: %d; want 503", rec.Code)
	}
}

type failing struct{}

func (failing) Advance(context.Context, string, uint64) error { return errors.New("down") }
