package embedetcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"lock.dev/lockd/internal/loopback"
)

// Config configures the embedded server.
type Config struct {
	// DataDir holds etcd's data. Required. Created with mode 0700 if missing.
	DataDir string
	// Logger receives etcd's own logs at warn level and above; nil discards
	// them.
	Logger *slog.Logger
	// Socket serves clients on the unix socket SocketName and the raft
	// peer listener on the unix socket PeerSocketName, both inside
	// DataDir (made mode 0700), instead of loopback TCP, so no other local
	// user can reach the server, its client API or its raft port (a
	// single member has no peer to dial). ClientURL, PeerURL and
	// AdvertisePeerURL must then be empty. lockd's embedded backend uses
	// it; tests that put a TCP proxy in front of etcd, and clusters of
	// several members, do not.
	Socket bool
	// ClientTLS, if set, serves clients over TLS (an https client URL) and
	// requires client certificates signed by ClientTLS.ClientCAFile: an
	// etcd that stands in for an external one reached over mTLS (tests,
	// lock.etcd.tls.*). It excludes Socket.
	ClientTLS *TLSFiles
	// ClientURL and PeerURL are the http URLs etcd listens on. They must be
	// on a loopback address. Empty: 127.0.0.1 with a free port.
	ClientURL string
	PeerURL   string
	// AdvertisePeerURL is the peer URL the other members dial (this
	// member's entry in InitialCluster), on a loopback address. Empty:
	// PeerURL. The chaos suite puts a proxy there to cut peer links.
	AdvertisePeerURL string
	// TickMs and ElectionMs are etcd's heartbeat interval and election
	// timeout (0: etcd's defaults, 100 and 1000). They also set etcd's
	// minimum lease TTL: 1.5 × ElectionMs, rounded up to whole seconds.
	TickMs     uint
	ElectionMs uint
	// QuotaBytes is etcd's backend quota (--quota-backend-bytes; C5
	// lock.embedded.quota-bytes). 0: etcd's default, 2 GiB.
	QuotaBytes int64
	// MaxTxnOps is etcd's limit of operations in one branch of a
	// transaction (--max-txn-ops). 0: etcd's default, 128. Tests lower it
	// (store/etcdstore's one-commit grant falls back when etcd refuses).
	MaxTxnOps uint
	// CompactionRetainRevisions: every CompactionInterval the history is
	// compacted to the current revision minus this many (C5
	// lock.embedded.compaction-retain-revisions). 0: only etcd's hourly
	// compaction.
	CompactionRetainRevisions int64
	// CompactionInterval is how often; 0 means DefaultCompactionInterval.
	// Tests shorten it.
	CompactionInterval time.Duration
	// Name, InitialCluster and ClusterState make the server one member of
	// a cluster (the chaos suite runs three): its member name ("" : lockd,
	// the single node's), the members as NAME=PEERURL,... ("": this member
	// alone) and "new" or "existing" ("": new). The name is kept in the
	// data dir, so it must not change between runs.
	Name           string
	InitialCluster string
	ClusterState   string
}

// TLSFiles name the PEM files of Config.ClientTLS.
type TLSFiles struct {
	CertFile, KeyFile, ClientCAFile string
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	upkeep    *upkeep
	endpoints []string
	closeOnce sync.Once
}

// memberName is the single member's name (Config.Name's default); it is
// stored in the data dir, so it must not change between runs.
const memberName = "lockd"

// SocketName is the client socket's file name in the data dir (Config.Socket).
const SocketName = "etcd.sock"

// PeerSocketName is the raft peer socket's file name in the data dir
// (Config.Socket).
const PeerSocketName = "peer.sock"

// maxSocketPath is the longest unix socket path Linux accepts (sun_path
// holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// portAttempts bounds the retries when a free port picked by the kernel is
// taken by someone else before etcd binds it.
const portAttempts = 5

// Start starts a single-node etcd server and returns once it serves
// clients, or when ctx ends (the server is then stopped again).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedetcd: data dir is required")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedetcd: start: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: create data dir: %w", err)
	}
	if cfg.Socket {
		if cfg.ClientURL != "" || cfg.PeerURL != "" || cfg.AdvertisePeerURL != "" {
			return nil, errors.New("embedetcd: Socket excludes ClientURL, PeerURL and AdvertisePeerURL")
		}
		if err := prepareSocket(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, cfg)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) ||
			(cfg.ClientURL != "" && cfg.PeerURL != "") || attempt == portAttempts {
			return s, err
		}
	}
}

func start(ctx context.Context, cfg Config) (*Server, error) {
	var clientURL *url.URL
	var err error
	switch {
	case cfg.Socket && cfg.ClientTLS != nil:
		return nil, errors.New("embedetcd: Socket and ClientTLS exclude each other")
	case cfg.Socket:
		clientURL, err = socketURL(cfg.DataDir)
	default:
		clientURL, err = loopbackURL("client", cfg.ClientURL)
	}
	if err != nil {
		return nil, err
	}
	var peerURL, advertisePeerURL *url.URL
	if cfg.Socket {
		peerURL, advertisePeerURL, err = peerSocketURLs(cfg.DataDir)
	} else {
		peerURL, err = loopbackURL("peer", cfg.PeerURL)
		advertisePeerURL = peerURL
	}
	if err != nil {
		return nil, err
	}
	if cfg.AdvertisePeerURL != "" {
		if advertisePeerURL, err = loopbackURL("advertised peer", cfg.AdvertisePeerURL); err != nil {
			return nil, err
		}
	}

	ec := embed.NewConfig()
	ec.Name = cmp.Or(cfg.Name, memberName)
	ec.Dir = cfg.DataDir
	ec.Logger = "zap"
	ec.LogLevel = "warn"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(ZapLogger(cfg.Logger))
	if cfg.ClientTLS != nil {
		clientURL.Scheme = "https"
		ec.ClientTLSInfo.CertFile = cfg.ClientTLS.CertFile
		ec.ClientTLSInfo.KeyFile = cfg.ClientTLS.KeyFile
		ec.ClientTLSInfo.TrustedCAFile = cfg.ClientTLS.ClientCAFile
		ec.ClientTLSInfo.ClientCertAuth = true
	}
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*advertisePeerURL}
	ec.InitialCluster = cmp.Or(cfg.InitialCluster, ec.Name+"="+advertisePeerURL.String())
	if cfg.ClusterState != "" {
		ec.ClusterState = cfg.ClusterState
	}
	if cfg.TickMs != 0 {
		ec.TickMs = cfg.TickMs
	}
	if cfg.ElectionMs != 0 {
		ec.ElectionMs = cfg.ElectionMs
	}
	// Keep an hour of history: enough for lagging watchers, and the
	// revision counter (the fencing token) is never affected by compaction.
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "1h"
	ec.QuotaBackendBytes = cfg.QuotaBytes
	if cfg.MaxTxnOps != 0 {
		ec.MaxTxnOps = cfg.MaxTxnOps
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: start: %w", err)
	}
	s := &Server{etcd: e}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		s.Close()
		return nil, fmt.Errorf("embedetcd: start: %w", err)
	case <-ctx.Done():
		s.Close()
		return nil, fmt.Errorf("embedetcd: start: %w", ctx.Err())
	}
	for _, l := range e.Clients {
		if l.Addr().Network() == "unix" {
			s.endpoints = append(s.endpoints, "unix://"+l.Addr().String())
			continue
		}
		s.endpoints = append(s.endpoints, clientURL.Scheme+"://"+l.Addr().String())
	}
	s.upkeep = startUpkeep(e, cfg)
	return s, nil
}

// prepareSocket makes the data dir private (mode 0700: only lockd's user
// may reach the socket inside it) and removes a socket left by a process
// that died, refusing when a live server still answers on it.
func prepareSocket(dataDir string) error {
	if err := os.Chmod(dataDir, 0o700); err != nil {
		return fmt.Errorf("embedetcd: make data dir private: %w", err)
	}
	u, err := socketURL(dataDir)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(u.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("embedetcd: client socket: %w", err)
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("embedetcd: %s exists and is not a socket", u.Path)
	}
	if c, err := net.Dial("unix", u.Path); err == nil {
		c.Close()
		return fmt.Errorf("embedetcd: %s: another etcd serves this data dir (a lockd still running or still shutting "+
			"down on it: wait for that process to exit, or use another --data-dir)", u.Path)
	}
	if err := os.Remove(u.Path); err != nil {
		return fmt.Errorf("embedetcd: remove stale client socket: %w", err)
	}
	return nil
}

// socketURL is the unix:// URL of the client socket in dataDir.
func socketURL(dataDir string) (*url.URL, error) {
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: data dir: %w", err)
	}
	path := filepath.Join(dir, SocketName)
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("embedetcd: client socket path %s is longer than %d bytes: use a shorter data dir", path, maxSocketPath)
	}
	return &url.URL{Scheme: "unix", Path: path}, nil
}

// peerSocketURLs are the listen and advertised URLs of the raft peer socket
// in dataDir. etcd's listener takes a unix socket's path from the URL's
// host (transport.NewListenerWithOpts(u.Host, u.Scheme)), which no URL
// string can carry for an absolute path; the advertised form (unix:///path)
// is the one the member's entry of the initial cluster parses back to. A
// single member never dials it.
func peerSocketURLs(dataDir string) (listen, advertise *url.URL, err error) {
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("embedetcd: data dir: %w", err)
	}
	path := filepath.Join(dir, PeerSocketName)
	if len(path) > maxSocketPath {
		return nil, nil, fmt.Errorf("embedetcd: peer socket path %s is longer than %d bytes: use a shorter data dir", path, maxSocketPath)
	}
	return &url.URL{Scheme: "unix", Host: path}, &url.URL{Scheme: "unix", Path: path}, nil
}

// loopbackURL parses a configured URL, or picks a free loopback port when
// raw is empty. Only http URLs on loopback addresses are accepted.
func loopbackURL(which, raw string) (*url.URL, error) {
	if raw == "" {
		// Someone else may take the port before etcd binds it; Start
		// retries then.
		port, err := loopback.FreePort()
		if err != nil {
			return nil, fmt.Errorf("embedetcd: %s url: %w", which, err)
		}
		return &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %s url: %w", which, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("embedetcd: %s url %q: scheme must be http", which, raw)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("embedetcd: %s url %q: host must be a loopback address", which, raw)
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("embedetcd: %s url %q: port is required", which, raw)
	}
	return u, nil
}

// PeerAddrs returns the addresses of the raft peer listeners (a unix
// socket with Config.Socket).
func (s *Server) PeerAddrs() []net.Addr {
	var out []net.Addr
	for _, p := range s.etcd.Peers {
		out = append(out, p.Addr())
	}
	return out
}

// Endpoints returns the client URLs to give clientv3.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// Stopped is closed when the server has stopped: after Close, or by
// itself, e.g. once it learns that it was removed from its cluster.
func (s *Server) Stopped() <-chan struct{} { return s.etcd.Server.StopNotify() }

// Err receives an error if the server fails while serving (a listener
// stops accepting, for example).
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server and waits until it has shut down. The data dir
// stays. Calling Close again does nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.upkeep != nil {
			s.upkeep.stop()
		}
		s.etcd.Close()
		<-s.etcd.Server.StopNotify()
	})
	return nil
}
