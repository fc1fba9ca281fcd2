package server_test

import (
	"net/http"
	"testing"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestHTTPAcquireAll: POST /v1/locks:acquire with keys (C2 #ct2-http,
// #ct2-acquire-all) grants every key with its own token, in the order
// asked; a try of a set with a key held by another session answers
// granted false and holds none of the set; a wait that times out leaves
// nothing; the one-key route still refuses keys.
func TestHTTPAcquireAll(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := startHTTP(t, backend, lockdtest.Options{})
		hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
		a, b := hc.open(longTTL), hc.open(longTTL)

		keys := []any{"hall/b", "hall/a"}
		ga := hc.ok("POST", "/v1/locks:acquire", obj{"session_id": a.id, "session_secret": a.secret, "keys": keys, "wait": true})
		grants, _ := ga["grants"].([]any)
		if ga["granted"] != true || len(grants) != 2 || num(t, ga["remaining_ms"]) <= 0 {
			t.Fatalf("acquire all = %v; want 2 grants with remaining_ms", ga)
		}
		tokens := map[string]int64{}
		for i, g := range grants {
			m, _ := g.(obj)
			if m["key"] != keys[i] || num(t, m["token"]) <= 0 {
				t.Fatalf("grant %d = %v; want %s with a token", i, m, keys[i])
			}
			tokens[str(m["key"])] = num(t, m["token"])
			if in := hc.ok("GET", "/v1/locks/"+str(m["key"]), nil); in["held"] != true || num(t, in["lock"].(obj)["token"]) != tokens[str(m["key"])] {
				t.Fatalf("GET /v1/locks/%s = %v; want a's grant", m["key"], in)
			}
		}

		// b asks for a free key and a held one: none of them.
		try := hc.ok("POST", "/v1/locks:acquire", obj{"session_id": b.id, "session_secret": b.secret, "keys": []any{"hall/0", "hall/a"}})
		if try["granted"] != false || len(try["grants"].([]any)) != 0 {
			t.Fatalf("try acquire all = %v; want granted false, no grants", try)
		}
		st, out := hc.do("POST", "/v1/locks:acquire", obj{"session_id": b.id, "session_secret": b.secret,
			"keys": []any{"hall/0", "hall/a"}, "wait": true, "wait_timeout_ms": 300})
		wantErr(t, "waiting acquire all past its timeout", st, out, http.StatusGatewayTimeout, wireerr.ReasonWaitTimeout)
		if in := hc.ok("GET", "/v1/locks/hall/0", nil); in["held"] != false {
			t.Fatalf("GET /v1/locks/hall/0 after b's failed calls = %v; want free", in)
		}

		// The one-key route names its key in the path: keys are refused there.
		st, out = hc.do("POST", "/v1/locks/hall/x:acquire", obj{"session_id": b.id, "session_secret": b.secret, "keys": []any{"hall/y"}})
		wantErr(t, "one-key route with keys", st, out, http.StatusBadRequest, wireerr.ReasonInvalidArgument)
		// No keys at all on the several-keys route: the key is empty.
		st, out = hc.do("POST", "/v1/locks:acquire", obj{"session_id": b.id, "session_secret": b.secret})
		wantErr(t, "several-keys route without keys", st, out, http.StatusBadRequest, wireerr.ReasonInvalidArgument)

		for k, tok := range tokens {
			hc.ok("POST", "/v1/locks/"+k+":release", obj{"session_id": a.id, "session_secret": a.secret, "token": tok})
		}
		gb := hc.ok("POST", "/v1/locks:acquire", obj{"session_id": b.id, "session_secret": b.secret, "keys": []any{"hall/0", "hall/a"}})
		if gb["granted"] != true || num(t, gb["grants"].([]any)[1].(obj)["token"]) <= tokens["hall/a"] {
			t.Fatalf("try acquire all after the release = %v; want granted, hall/a's token above %d", gb, tokens["hall/a"])
		}
	})
}
