// Package abuse replays, against a real lockd (the binary, as a child
// process) with mTLS and an access policy, what a stranger tried on a
// network setup (issue 23): a principal without any rule flooding
// connections (F1), a principal flooding sessions and parking KeepAlive
// streams on made-up sessions (F3, F2), an unsafe start (F5), a flood of plaintext requests to
// the TLS port (F6), bad input (F7), and the documented behaviours a
// stranger got wrong (%2F, bare prefix keys, ListSessions in `lockd auth
// check`, 401 vs 403 in the CLI). The package has tests only.
//
// LOCKD_TEST_ABUSE_LOCKD names a lockd binary to run instead of building
// cmd/lockd (to show what an older build does: the suite passes only
// flags every build since issue 16 accepts).
package abuse
