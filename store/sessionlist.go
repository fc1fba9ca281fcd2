package store

import "time"

// SessionQuery selects a page of ListSessions.
type SessionQuery struct {
	// After lists sessions whose id sorts strictly after it ("" for the
	// first page).
	After SessionID
	// Limit is the page size (ListLimit: 0 means 100, at most 1000).
	Limit int
	// Principal, when ByPrincipal, lists only the sessions bound to it
	// ("" then selects sessions opened without a principal).
	Principal   string
	ByPrincipal bool
}

// SessionInfo describes one live session (ListSessions). It never holds
// the secret or its hash.
type SessionInfo struct {
	ID        SessionID
	Principal string
	Owner     string
	Labels    map[string]string
	// TTL is the TTL the backend applies.
	TTL time.Duration
	// Remaining is the bound the backend proves at the call, as Heartbeat
	// reports it (C2 #ct2-deadline); listing extends nothing.
	Remaining time.Duration
	// Locks is the number of the session's grants.
	Locks int
}

// CheckSessionQuery validates q and returns its effective limit.
func CheckSessionQuery(q SessionQuery) (int, error) {
	if q.After != "" {
		if err := ValidateSessionID(q.After); err != nil {
			return 0, err
		}
	}
	if err := validatePrincipal(q.Principal); err != nil {
		return 0, err
	}
	return ListLimit(q.Limit)
}
