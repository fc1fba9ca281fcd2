package embedetcd_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
)

// tcpListeners returns the local addresses (hex, as /proc/net/tcp{,6}
// writes them) of the TCP sockets this process listens on.
func tcpListeners(t *testing.T) []string {
	t.Helper()
	mine := map[string]bool{} // socket inodes of this process
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) > 9 && fs[3] == "0A" && mine[fs[9]] { // 0A: LISTEN
				out = append(out, fs[1])
			}
		}
		f.Close()
	}
	slices.Sort(out)
	return out
}

// TestSocketModeOpensNoTCPPort: with Config.Socket (lockd's embedded
// backend) the embedded etcd listens on no TCP port at all: clients and the
// raft peer listener are unix sockets inside the data dir, which is mode
// 0700, so no other local user can talk to it (before, the peer listener
// was a loopback TCP port anyone on the host could reach). A data dir
// first served over TCP (an older lockd) is served again in socket mode.
func TestSocketModeOpensNoTCPPort(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// An older lockd's data dir: peer on a loopback TCP port.
	old, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	rev := put(t, old)
	old.Close()

	before := tcpListeners(t)
	s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, Socket: true})
	if err != nil {
		t.Fatalf("Start(Socket) on a data dir served over TCP before: %v", err)
	}
	defer s.Close()
	if after := tcpListeners(t); !slices.Equal(after, before) {
		t.Errorf("TCP listeners of the process: %v before Start, %v after; want no new one", before, after)
	}
	for _, a := range s.PeerAddrs() {
		if a.Network() != "unix" || a.String() != filepath.Join(dir, embedetcd.PeerSocketName) {
			t.Errorf("peer listener %s %s; want the unix socket %s", a.Network(), a, filepath.Join(dir, embedetcd.PeerSocketName))
		}
	}
	if len(s.PeerAddrs()) != 1 {
		t.Errorf("peer listeners %v; want one", s.PeerAddrs())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode = %v, %v; want 0700 (the sockets are reachable only by lockd's user)", fi.Mode(), err)
	}
	if got := put(t, s); got <= rev {
		t.Errorf("revision after the restart in socket mode = %d; want above %d (same data)", got, rev)
	}
	if _, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: t.TempDir(), Socket: true, PeerURL: "http://127.0.0.1:1"}); err == nil ||
		!strings.Contains(fmt.Sprint(err), "PeerURL") {
		t.Errorf("Start(Socket, PeerURL) = %v; want an error naming PeerURL", err)
	}
}
