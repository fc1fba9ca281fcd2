// Package sessions is the server's session table: the one owner of the
// server's session state. A Table holds the records of the sessions this
// replica serves, the mutex that guards them, the silence heap and the one
// goroutine that closes silent sessions (owned: it stops on Close, which
// waits for it), the counts the limits need (sessions being opened, the
// sessions and opens of each principal, Acquire calls in progress), the grants each session holds as this server knows them
// (tracking and gone tokens), the lock-lost notices and their
// acknowledgements, and the registry of KeepAlive streams. The server's
// handlers (service, keepalive, drain, notify) call its methods and never
// lock it themselves. It talks to the store through Backend.
//
// The safety rule it enforces is the server's part of the timing chain
// (docs/safety.md, "What the server may and may not do"; C2 #ct2-deadline,
// #ct2-replicas): every reply that extends a client's trust (open,
// heartbeat, grant) is sent only after the record's silence deadline was
// moved to at least (receipt of the request) + max(TTL, Remaining granted),
// and only while the record may extend trust (Provisional or Live). The
// silence loop closes a session only once that deadline passed, and moves
// the record out of Live first, under the same mutex. A reply whose store
// answer overlapped a silence close extends nothing (ErrCloseOverlap), and a
// reply waits while a silence close is in flight.
//
// # States
//
// A record's life is one State; adopted (the session was not opened here)
// and seeded (its grants are known in full) are properties beside it.
//
//	Provisional  exists only while an RPC pins it; not watched for silence
//	Live         opened here or adopted: watched for silence, may extend trust
//	Expiring     the silence loop is closing it (ExpireSession), or the backend refused and it waits for a retry
//	Closing      its client or an operator closed it (CloseSession); the silence loop retries a failed close
//	Draining     Shutdown with close-sessions-on-shutdown closes it once its client acknowledged its notices
//	Gone         the store says the session is dead or closed; dropped once unpinned
//
// The allowed transitions, enforced in one place (Table.move, which refuses
// any other; TestTransitionTable checks the code's table against this one):
//
//	from         to           when
//	Provisional  Live         adopt: a heartbeat or grant the store answered live
//	Provisional  Closing      CloseSession
//	Provisional  Gone         the store says dead
//	Live         Expiring     silence: the deadline passed
//	Live         Closing      CloseSession
//	Live         Draining     CloseAll
//	Live         Gone         the store says dead
//	Expiring     Live         revive: the backend refused the close, and a call reached this server
//	Expiring     Closing      CloseSession
//	Expiring     Draining     CloseAll
//	Expiring     Gone         ExpireSession ended it, or the store says dead
//	Closing      Draining     CloseAll
//	Closing      Gone         closed, or the store says dead
//	Draining     Gone         closed on shutdown, or the store says dead
//
// The table's own tests (no gRPC; a fake clock and backend) cover each
// transition; TestTransitionTable checks that every row above is listed
// here and that each test named exists:
//
//	Provisional  Live      TestAdoptByHeartbeat TestAdoptByGrantGuessesMaxTTL
//	Provisional  Closing   TestClose
//	Provisional  Gone      TestEndFromEveryState TestBeatAnswers
//	Live         Expiring  TestSilenceClose TestSilenceCloseRefusedThenRevived
//	Live         Closing   TestClose
//	Live         Draining  TestCloseAll TestCloseAllLeavesUnsafe
//	Live         Gone      TestEndFromEveryState TestBeatAnswers
//	Expiring     Live      TestSilenceCloseRefusedThenRevived TestCloseOverlapExtendsNothing
//	Expiring     Closing   TestCloseDuringSilenceClose
//	Expiring     Draining  TestCloseAll
//	Expiring     Gone      TestSilenceClose TestSilenceCloseAlreadyGone TestSilenceCloseFailsAndRetries TestReplyWaitsForCloseInFlight
//	Closing      Draining  TestCloseAll
//	Closing      Gone      TestClose TestCloseDuringSilenceClose TestEndFromEveryState
//	Draining     Gone      TestCloseAll TestEndFromEveryState
//
// A new record starts Provisional (Pin, Attach) or Live (Open). Gone is
// final. Every state but Provisional and Live refuses to extend trust;
// Closing, Draining and Gone (and every state once CloseAll began) are
// ending: a grant is refused before the store is asked.
package sessions
