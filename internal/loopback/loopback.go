// Package loopback hands out free TCP ports on 127.0.0.1 for the processes
// lockd starts on one machine: embedded and child etcd members, a local
// PostgreSQL, the bench's replicas and the chaos suite's clusters.
//
// A port is free when it is handed out; another process may take it before
// the caller binds it, so a caller retries a bind that finds it taken.
package loopback

import "net"

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: each listener stays open until all are chosen, so no port
// comes twice.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
