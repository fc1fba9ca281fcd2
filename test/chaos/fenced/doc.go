// Package fenced is the fenced resource of the chaos suite: a small HTTP
// service on loopback that stands for "the thing the lock protects".
//
// Workers write to it while they hold a lock, sending the key, their process
// id and the grant's fencing token. With Config.CheckTokens on, the server
// accepts a write for a key only if its token is at least the highest token
// it has accepted for that key, which is exactly the check a real resource
// does to make a superseded holder harmless (a paused holder that resumes and
// writes with its old token is refused). Every accepted write is recorded in
// acceptance order with the writer, the token and the run time (package
// history's clock), for the checkers in package check.
//
// With CheckTokens off the server accepts everything. That is the control
// run: the same workload must then show stale writes and overlapping writers
// under the pause scenario, or the suite could not see a violation at all.
//
// # Modes
//
// A write names the mode of the grant it comes from (C2 #ct2-multi), and
// with CheckTokens on the server applies that mode's rule:
//
//   - plain ("") and exclusive: the token is at least the highest token
//     accepted for the key in any mode (a writer is superseded by every
//     later grant, reader or writer);
//   - shared (a reader's read): the token is at least the highest
//     exclusive token accepted for the key. Readers do not supersede each
//     other; a reader whose grant ended before a writer's began has a lower
//     token than that writer, and is refused once the writer has written;
//   - slot (a semaphore's): the token is among the key's current holders as
//     the lock service reports them (Config.SlotCheck, lockd's CheckToken, or
//     Config.SlotHolders, lockd's Inspect),
//     asked while no other slot write is applied. Token order alone cannot
//     fence a semaphore: a live slot may carry a lower token than several
//     slots that came and went since, so the resource asks who holds.
//
// # Protocol
//
//	POST /write  {"key":"k","writer":"w1","token":42,"mode":"shared"}
//	  200 {"seq":7}            accepted; seq is the acceptance order, from 1
//	  409 {"highest":43}       refused: a higher token was already accepted
//	                           (a slot that holds nothing: no highest)
//	  503                      a slot's holders could not be read
//	  400                      malformed request
//	GET /writes                200 [Write, ...] every accepted write, in order
//
// The server listens on 127.0.0.1 only. Close stops it and waits for its
// goroutines; Client.Close releases the client's idle connections.
package fenced
