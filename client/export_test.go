package client

// SetHeartbeatPhase places c's heartbeat grid (keepaliver.aligned) at phase
// of an interval after the client's creation (0 ≤ phase < 1; random
// otherwise), for tests under a fake clock that must know when heartbeats
// leave. Call it before the client's first session.
func SetHeartbeatPhase(c *Client, phase float64) {
	c.ka.mu.Lock()
	defer c.ka.mu.Unlock()
	c.ka.phase = phase
}
