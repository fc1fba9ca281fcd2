package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Config configures the embedded server.
type Config struct {
	// DataDir holds etcd's data. Required. Created with mode 0700 if missing.
	DataDir string
	// Logger receives etcd's own logs at warn level and above; nil discards
	// them.
	Logger *slog.Logger
	// ClientURL and PeerURL are the http URLs etcd listens on. They must be
	// on a loopback address. Empty: 127.0.0.1 with a free port.
	ClientURL string
	PeerURL   string
	// TickMs and ElectionMs are etcd's heartbeat interval and election
	// timeout (0: etcd's defaults, 100 and 1000). They also set etcd's
	// minimum lease TTL: 1.5 × ElectionMs, rounded up to whole seconds.
	TickMs     uint
	ElectionMs uint
	// QuotaBytes is etcd's backend quota (--quota-backend-bytes; C5
	// lock.embedded.quota-bytes). 0: etcd's default, 2 GiB.
	QuotaBytes int64
	// CompactionRetainRevisions: every CompactionInterval the history is
	// compacted to the current revision minus this many (C5
	// lock.embedded.compaction-retain-revisions). 0: only etcd's hourly
	// compaction.
	CompactionRetainRevisions int64
	// CompactionInterval is how often; 0 means DefaultCompactionInterval.
	// Tests shorten it.
	CompactionInterval time.Duration
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	upkeep    *upkeep
	endpoints []string
	closeOnce sync.Once
}

// memberName is the single member's name; it is stored in the data dir, so
// it must not change between runs.
const memberName = "lockd"

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
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, cfg)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) ||
			(cfg.ClientURL != "" && cfg.PeerURL != "") || attempt == portAttempts {
			return s, err
		}
	}
}

func start(ctx context.Context, cfg Config) (*Server, error) {
	clientURL, err := loopbackURL("client", cfg.ClientURL)
	if err != nil {
		return nil, err
	}
	peerURL, err := loopbackURL("peer", cfg.PeerURL)
	if err != nil {
		return nil, err
	}

	ec := embed.NewConfig()
	ec.Name = memberName
	ec.Dir = cfg.DataDir
	ec.Logger = "zap"
	ec.LogLevel = "warn"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(ZapLogger(cfg.Logger))
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	ec.InitialCluster = memberName + "=" + peerURL.String()
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
		s.endpoints = append(s.endpoints, "http://"+l.Addr().String())
	}
	s.upkeep = startUpkeep(e, cfg)
	return s, nil
}

// loopbackURL parses a configured URL, or picks a free loopback port when
// raw is empty. Only http URLs on loopback addresses are accepted.
func loopbackURL(which, raw string) (*url.URL, error) {
	if raw == "" {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("embedetcd: %s url: %w", which, err)
		}
		return &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", port)}, nil
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

// freePort asks the kernel for a free loopback port. Someone else may take
// it before etcd binds it; Start retries then.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// Endpoints returns the client URLs to give clientv3.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

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
