package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// peerNet sits on the peer links of a three-member etcd cluster (fault
// LeaderIsolate): every member advertises a proxy's address as its peer URL,
// so every connection between members goes through the proxy of the member
// it is made to. etcd's peer protocol (rafthttp) names the member that
// opened a connection in the X-Server-From header of its first request, and
// a connection carries the messages of one pair of members both ways (a
// member reads the messages of a stream it opened), so cutting the
// connections opened by or to a member isolates it from the other members:
// it keeps running, and lockd, a client, can still reach it.
//
// A cut closes the member's connections and every new one at once; the
// members keep redialling until the heal.
type peerNet struct {
	proxies []*peerProxy

	mu       sync.Mutex
	isolated string // member id (hex, as in X-Server-From), or ""
	ids      map[string]string
}

// peerProxy forwards the connections to one member's peer listener.
type peerProxy struct {
	net    *peerNet
	member string // name
	ln     net.Listener
	target string // host:port
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[*peerConn]struct{}
}

// peerConn is one proxied connection: the member that opened it (from its
// first request; "" if it named none) and both sockets.
type peerConn struct {
	from      string
	down, up  net.Conn
	closeOnce sync.Once
}

func (c *peerConn) close() {
	c.closeOnce.Do(func() {
		c.down.Close()
		if c.up != nil {
			c.up.Close()
		}
	})
}

// startEtcdIsolable starts an n-member cluster whose peer links run through
// a peerNet.
func startEtcdIsolable(bin, dir string, n int) ([]*etcdNode, *peerNet, error) {
	nodes, err := newEtcdNodes(bin, dir, n)
	if err != nil {
		return nil, nil, err
	}
	pn := &peerNet{}
	var peers []string
	for _, nd := range nodes {
		px, err := pn.listen(nd)
		if err != nil {
			pn.close()
			return nil, nil, err
		}
		nd.advertise = "http://" + px.ln.Addr().String()
		peers = append(peers, nd.name+"="+nd.advertise)
	}
	for _, nd := range nodes {
		nd.cluster = strings.Join(peers, ",")
	}
	if nodes, err = launchEtcd(nodes); err != nil {
		pn.close()
		return nil, nil, err
	}
	return nodes, pn, nil
}

func (pn *peerNet) listen(nd *etcdNode) (*peerProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("peer proxy of %s: %w", nd.name, err)
	}
	px := &peerProxy{net: pn, member: nd.name, ln: ln, target: strings.TrimPrefix(nd.peerURL, "http://"),
		conns: map[*peerConn]struct{}{}}
	pn.proxies = append(pn.proxies, px)
	px.wg.Add(1)
	go px.accept() // returns when close closes the listener
	return px, nil
}

// memberIDs learns the members' ids (name → hex id) from the cluster.
func (pn *peerNet) memberIDs(ctx context.Context, nodes []*etcdNode) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints(nodes), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(mctx)
	if err != nil {
		return fmt.Errorf("etcd member list: %w", err)
	}
	ids := map[string]string{}
	for _, m := range resp.Members {
		ids[m.Name] = strconv.FormatUint(m.ID, 16)
	}
	pn.mu.Lock()
	pn.ids = ids
	pn.mu.Unlock()
	return nil
}

// isolate cuts every peer link of the named member.
func (pn *peerNet) isolate(ctx context.Context, nodes []*etcdNode, member string) error {
	pn.mu.Lock()
	known := pn.ids != nil
	pn.mu.Unlock()
	if !known {
		if err := pn.memberIDs(ctx, nodes); err != nil {
			return err
		}
	}
	pn.mu.Lock()
	id, ok := pn.ids[member]
	if ok {
		pn.isolated = id
	}
	pn.mu.Unlock()
	if !ok {
		return fmt.Errorf("isolate %s: not a member", member)
	}
	for _, px := range pn.proxies {
		px.mu.Lock()
		for c := range px.conns {
			if pn.cut(px.member, c.from) {
				c.close()
			}
		}
		px.mu.Unlock()
	}
	return nil
}

// heal ends the isolation.
func (pn *peerNet) heal() {
	pn.mu.Lock()
	pn.isolated = ""
	pn.mu.Unlock()
}

// cut reports whether a connection to member "to" opened by the member with
// id from is cut now.
func (pn *peerNet) cut(to, from string) bool {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	return pn.isolated != "" && (pn.ids[to] == pn.isolated || from == pn.isolated)
}

// close stops every proxy and closes its connections.
func (pn *peerNet) close() {
	for _, px := range pn.proxies {
		px.ln.Close()
		px.mu.Lock()
		for c := range px.conns {
			c.close()
		}
		px.mu.Unlock()
		px.wg.Wait()
	}
}

func (px *peerProxy) accept() {
	defer px.wg.Done()
	for {
		down, err := px.ln.Accept()
		if err != nil {
			return
		}
		px.wg.Add(1)
		go px.serve(down) // returns when either side closes
	}
}

// serve reads the head of the connection's first request, then forwards
// both ways unless the connection is cut.
func (px *peerProxy) serve(down net.Conn) {
	defer px.wg.Done()
	c := &peerConn{down: down}
	defer c.close()
	br := bufio.NewReader(down)
	_ = down.SetReadDeadline(time.Now().Add(10 * time.Second))
	head, from, err := readHead(br)
	_ = down.SetReadDeadline(time.Time{})
	if err != nil {
		return
	}
	c.from = from
	if px.net.cut(px.member, from) {
		return
	}
	up, err := net.DialTimeout("tcp", px.target, 2*time.Second)
	if err != nil {
		return
	}
	c.up = up
	px.mu.Lock()
	px.conns[c] = struct{}{}
	px.mu.Unlock()
	defer func() {
		px.mu.Lock()
		delete(px.conns, c)
		px.mu.Unlock()
	}()
	if px.net.cut(px.member, from) { // isolated while dialling
		return
	}
	if _, err := up.Write(head); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { // returns when either side closes
		_, _ = io.Copy(up, br)
		c.close()
		done <- struct{}{}
	}()
	_, _ = io.Copy(down, up)
	c.close()
	<-done
}

// readHead reads an HTTP request head (request line and headers) and
// returns its bytes and its X-Server-From header.
func readHead(br *bufio.Reader) (head []byte, from string, err error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, "", err
		}
		b.WriteString(line)
		if line == "\r\n" || line == "\n" {
			return []byte(b.String()), from, nil
		}
		if b.Len() > 64<<10 {
			return nil, "", errors.New("request head too long")
		}
		if k, v, ok := strings.Cut(line, ":"); ok && textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(k)) == "X-Server-From" {
			from = strings.TrimSpace(v)
		}
	}
}
