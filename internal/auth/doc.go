// Package auth is lockd's identity and access-rule engine (C5 #ct5-auth):
// who is calling, and may they do this to that key.
//
// Identity: the principal of a gRPC call is the verified client
// certificate's first URI SAN (SPIFFE-style) or else its CN, or the
// principal of its bearer token ("authorization: Bearer <token>", looked up
// by SHA-256 in lock.auth.tokens-file and compared in constant time; the
// file never holds tokens), or Anonymous. Refused credentials are
// ErrUnauthenticated, never anonymous.
//
// Policy: lock.auth.policy-file lists rules
//
//	rules:
//	  - name: billing
//	    principals: [alice, "spiffe://example.org/ns/prod/sa/billing"]
//	    prefixes: ["billing/"]
//	    allow: [read, lock]
//
// that allow actions (read: Inspect, List, Watch; lock: sessions, Acquire,
// Release; admin: Revoke) to principals on keys. Prefixes match whole path
// segments: "a" and "a/" cover "a", "a/" and "a/x", never "ab". With a
// policy every call no rule allows is denied (RuleDefaultDeny); without
// one every call is allowed (RuleNoPolicy). Decide and Scope report the
// rule that made each decision, for the audit trail and `lockd auth check`.
//
// Authorizer holds the policy and tokens in force, re-reads the files when
// they change (checked every second by a goroutine that Close stops) and on
// Reload (lockd serve's SIGHUP), and keeps the previous version when a new one is malformed
// (ParseError names the line and the reason; C4 auth_reload_failed). The
// server's interceptor (server/auth.go) is its only caller on the RPC path.
package auth
