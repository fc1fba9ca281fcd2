// Package cli is the lockd command line: one cobra command per file, run
// in-process by Run with injectable standard streams, so tests drive every
// subcommand without building the binary.
//
//	lockd serve                              run the lock service (C5 configuration)
//	lockd run [--ttl D] [--wait D] [--grace D] [--max-runtime D]
//	          [--conflict-exit-code N] [--owner S] KEY -- CMD [ARGS...]
//	lockd inspect KEY                        describe one key
//	lockd ls [PREFIX]                        list held keys
//	lockd revoke KEY                         revoke a key's grant (administrative)
//	lockd check [--cached] KEY TOKEN         is TOKEN a current grant of KEY (exit 0 yes, 3 no)
//	lockd watch [PREFIX]                     one line per lock event
//	lockd elect [--value V] [--owner S] NAME -- CMD [ARGS...]
//	                                         run CMD only while leader of election NAME
//	lockd leader [--watch] NAME              the election's leader, or "no leader"
//	lockd auth check PRINCIPAL ACTION KEY    decide a call against a policy file (offline)
//	lockd auth hash-token PRINCIPAL          a tokens-file line for the token on stdin
//
// Client commands (run, inspect, ls, revoke, check, watch, elect, leader) reach the
// server at --server, else $LOCKD_SERVER, else 127.0.0.1:7420. inspect, ls,
// check, watch and leader take --output text|json.
//
// # Exit codes
//
//	0    success
//	1    an error (message on stderr, prefixed with the command); lockd auth
//	     check: the call is denied
//	2    a usage error (bad flag, missing or extra argument)
//	3    lockd check: TOKEN is not a current grant of KEY
//	69   lockd run: the server could not be reached before the lock was held
//	     (lockd elect: before the session was open, or while campaigning)
//	75   lockd run: the lock was lost while CMD ran; CMD was terminated
//	     (lockd elect: the leadership was lost)
//	80   lockd run: KEY was locked and --wait 0 was given (--conflict-exit-code)
//	81   lockd run: --wait ran out before the lock was granted
//	124  lockd run: CMD ran longer than --max-runtime; CMD was terminated
//	N    lockd run, elect: CMD's own exit status; 128+S when CMD died of signal S,
//	     126 when CMD could not be executed, 127 when it was not found
package cli
