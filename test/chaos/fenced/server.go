package fenced

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// Config configures a Server.
type Config struct {
	// CheckTokens makes the server refuse a write whose token is lower than
	// the highest it has accepted for the key. False accepts every write
	// (the control run).
	CheckTokens bool
	// Clock timestamps accepted writes in run time. Nil: a clock whose epoch
	// is the server's start.
	Clock *history.Clock
}

// Write is one accepted write.
type Write struct {
	// Seq is the acceptance order, from 1, over all keys.
	Seq    uint64 `json:"seq"`
	Key    string `json:"key"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
	// At is the run time of acceptance.
	At int64 `json:"at"`
}

// writeRequest is the body of POST /write.
type writeRequest struct {
	Key    string `json:"key"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
}

type writeReply struct {
	Seq     uint64 `json:"seq,omitempty"`
	Highest uint64 `json:"highest,omitempty"`
}

// Server is the fenced resource. Its methods are safe for concurrent use.
type Server struct {
	cfg  Config
	ln   net.Listener
	http *http.Server
	done chan struct{} // closed when Serve has returned

	mu       sync.Mutex
	highest  map[string]uint64
	writes   []Write
	rejected int
}

// Start starts a server on 127.0.0.1 with a kernel-chosen port.
func Start(cfg Config) (*Server, error) {
	if cfg.Clock == nil {
		cfg.Clock = history.NewClock(time.Now())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fenced: listen: %w", err)
	}
	s := &Server{cfg: cfg, ln: ln, done: make(chan struct{}), highest: map[string]uint64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /write", s.handleWrite)
	mux.HandleFunc("GET /writes", s.handleWrites)
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	// Exits when Close closes the listener (Serve returns ErrServerClosed).
	go func() {
		defer close(s.done)
		_ = s.http.Serve(ln)
	}()
	return s, nil
}

// URL returns the server's base URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// CheckTokens reports whether the server checks tokens.
func (s *Server) CheckTokens() bool { return s.cfg.CheckTokens }

// Accept applies the fencing rule to a write and records it if accepted. It
// is what POST /write does, exported so in-process workers can skip HTTP.
// It returns the write's acceptance sequence number, or ok false and the
// highest token accepted for the key.
func (s *Server) Accept(key, writer string, token uint64) (seq uint64, highest uint64, ok bool) {
	at := s.cfg.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.highest[key]
	if s.cfg.CheckTokens && token < h {
		s.rejected++
		return 0, h, false
	}
	s.highest[key] = max(h, token)
	seq = uint64(len(s.writes)) + 1
	s.writes = append(s.writes, Write{Seq: seq, Key: key, Writer: writer, Token: token, At: at})
	return seq, 0, true
}

// Writes returns a copy of every accepted write, in acceptance order.
func (s *Server) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Write(nil), s.writes...)
}

// Rejected returns how many writes the token check refused.
func (s *Server) Rejected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rejected
}

// Close stops the server, closing open connections, and waits for its
// goroutines to return.
func (s *Server) Close() error {
	err := s.http.Close()
	<-s.done
	if err != nil {
		return fmt.Errorf("fenced: close: %w", err)
	}
	return nil
}

func (s *Server) handleWrite(w http.ResponseWriter, r *http.Request) {
	var req writeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "fenced: bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Key == "" || req.Writer == "" {
		http.Error(w, "fenced: bad request: key and writer are required", http.StatusBadRequest)
		return
	}
	seq, highest, ok := s.Accept(req.Key, req.Writer, req.Token)
	status := http.StatusOK
	if !ok {
		status = http.StatusConflict
	}
	writeJSON(w, status, writeReply{Seq: seq, Highest: highest})
}

func (s *Server) handleWrites(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Writes())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
