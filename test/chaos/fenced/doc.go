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
// # Protocol
//
//	POST /write  {"key":"k","writer":"w1","token":42}
//	  200 {"seq":7}            accepted; seq is the acceptance order, from 1
//	  409 {"highest":43}       refused: a higher token was already accepted
//	  400                      malformed request
//	GET /writes                200 [Write, ...] every accepted write, in order
//
// The server listens on 127.0.0.1 only. Close stops it and waits for its
// goroutines; Client.Close releases the client's idle connections.
package fenced
