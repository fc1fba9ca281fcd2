// Package fencehttp is the lockd fence for HTTP services (C2
// #ct2-fence-kit): net/http middleware that refuses a request carrying a
// fencing token lower than the highest accepted for its key.
//
// A client holding a lockd lock sends the lock's key and token with each
// write:
//
//	Lockd-Fence-Key: jobs/nightly      (percent-encoded as in a URL path)
//	Lockd-Fence-Token: 1764929812345678
//
// The middleware advances the key's high-water mark in a fence.Store
// (fence.MemoryStore, or fencepg.Store to share marks between replicas and
// restarts) and calls the handler, or answers 409 Conflict with
//
//	{"error":"stale_token","key":"jobs/nightly","token":"…","high_water":"…"}
//
// A request without the headers is answered 428 (unless AllowUnfenced),
// malformed ones 400, a store failure 503: never passed on.
package fencehttp

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"lock.dev/lockd/fence"
)

// The request headers.
const (
	HeaderKey   = "Lockd-Fence-Key"
	HeaderToken = "Lockd-Fence-Token"
)

// Options configure the middleware.
type Options struct {
	// Store keeps the marks. Required.
	Store fence.Store
	// Metrics, if set, counts refused requests (resource "http").
	Metrics *fence.Metrics
	// AllowUnfenced passes requests that carry neither header to the
	// handler unchecked (say, reads). Default: 428.
	AllowUnfenced bool
	// Serialize runs the handler of a fenced request while holding the
	// key (in this process): no other fenced request of the key is checked
	// or handled meanwhile, so a request accepted with an older token
	// cannot still be writing when a newer one is accepted.
	Serialize bool
}

// Middleware returns the fence in front of a handler. It panics if
// opts.Store is nil (a programming error, found at start-up).
func Middleware(opts Options) func(http.Handler) http.Handler {
	if opts.Store == nil {
		panic("fencehttp: Options.Store is nil")
	}
	keys := &keyLocks{m: map[string]*keyLock{}}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rawKey, rawTok := r.Header.Get(HeaderKey), r.Header.Get(HeaderToken)
			if rawKey == "" && rawTok == "" {
				if opts.AllowUnfenced {
					next.ServeHTTP(w, r)
					return
				}
				answer(w, http.StatusPreconditionRequired, map[string]string{"error": "fence_required",
					"message": "send the lock's key and fencing token in " + HeaderKey + " and " + HeaderToken})
				return
			}
			key, kerr := url.PathUnescape(rawKey)
			token, terr := strconv.ParseUint(rawTok, 10, 64)
			if kerr != nil || terr != nil || fence.Validate(key, token) != nil {
				answer(w, http.StatusBadRequest, map[string]string{"error": "bad_fence",
					"message": HeaderKey + " must be a non-empty key and " + HeaderToken + " a decimal token from 1 to 2^63-1"})
				return
			}
			if opts.Serialize {
				unlock := keys.lock(key)
				defer unlock()
			}
			err := opts.Store.Advance(r.Context(), key, token)
			var se *fence.StaleError
			switch {
			case err == nil:
				next.ServeHTTP(w, r)
			case errors.As(err, &se):
				opts.Metrics.Refused(fence.ResourceHTTP)
				answer(w, http.StatusConflict, map[string]string{"error": "stale_token", "key": key,
					"token": strconv.FormatUint(token, 10), "high_water": strconv.FormatUint(se.HighWater, 10),
					"message": "a newer holder of the lock has written: this token is stale"})
			default:
				answer(w, http.StatusServiceUnavailable, map[string]string{"error": "fence_unavailable",
					"message": "the fence could not check the token"})
			}
		})
	}
}

func answer(w http.ResponseWriter, status int, body map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// keyLocks serialises fenced requests per key (Options.Serialize).
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

func (k *keyLocks) lock(key string) (unlock func()) {
	k.mu.Lock()
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
