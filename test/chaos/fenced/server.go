package fenced

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/fence"
	"lock.dev/lockd/fence/fencepg"
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
	// SlotHolders, if set, returns the tokens of the current holders of a
	// semaphore key, as the lock service reports them (lockd's Inspect):
	// the check of ModeSlot writes. Without it, with CheckTokens on, every
	// ModeSlot write is refused.
	SlotHolders func(ctx context.Context, key string) ([]uint64, error)
	// SlotCheck, if set, replaces SlotHolders: whether token is a current
	// grant of key, as the lock service answers it (lockd's CheckToken,
	// C2 #ct2-check-token).
	SlotCheck func(ctx context.Context, key string, token uint64) (bool, error)
	// PGFence, if set (with CheckTokens on), fences plain writes with the
	// shipped PostgreSQL fence (fence/fencepg, C2 #ct2-fence-kit) instead
	// of the in-memory check: each write is one transaction that calls
	// lockd_fence_check on this pool, whose lockd_fence table must exist
	// (fencepg.Apply). The other modes keep their in-memory rules.
	PGFence *pgxpool.Pool
}

// Modes of a write: which grant of a key wrote (package doc, Modes).
const (
	// ModePlain: a plain lock's grant (the empty mode).
	ModePlain = ""
	// ModeExclusive: the exclusive side of a read/write lock.
	ModeExclusive = "exclusive"
	// ModeShared: the shared side of a read/write lock (a reader's read).
	ModeShared = "shared"
	// ModeSlot: a slot of a semaphore.
	ModeSlot = "slot"
)

// slotCheckTimeout bounds one SlotHolders call.
const slotCheckTimeout = 3 * time.Second

// Write is one accepted write.
type Write struct {
	// Seq is the acceptance order, from 1, over all keys.
	Seq    uint64 `json:"seq"`
	Key    string `json:"key"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
	// Mode is the grant's mode (ModePlain, ModeExclusive, ModeShared,
	// ModeSlot).
	Mode string `json:"mode,omitempty"`
	// At is the run time of acceptance.
	At int64 `json:"at"`
}

// writeRequest is the body of POST /write.
type writeRequest struct {
	Key    string `json:"key"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
	Mode   string `json:"mode,omitempty"`
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

	// slotMu serialises ModeSlot writes, each from its SlotHolders call to
	// its acceptance: no other slot write comes in between.
	slotMu sync.Mutex

	// pgMu serialises plain writes through the PostgreSQL fence, each from
	// its transaction's start to its record: acceptance order is the
	// fence's commit order.
	pgMu sync.Mutex

	mu         sync.Mutex
	highest    map[string]uint64 // any mode
	excl       map[string]uint64 // ModeExclusive only
	writes     []Write
	rejected   int
	pgRejected int // of rejected, those the PostgreSQL fence refused
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
	s := &Server{cfg: cfg, ln: ln, done: make(chan struct{}), highest: map[string]uint64{}, excl: map[string]uint64{}}
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

// Accept applies the fencing rule to a write of a plain lock's grant and
// records it if accepted (AcceptMode with ModePlain). It is what POST /write
// does, exported so in-process workers can skip HTTP. It returns the
// write's acceptance sequence number, or ok false and the highest token
// accepted for the key.
func (s *Server) Accept(key, writer string, token uint64) (seq uint64, highest uint64, ok bool) {
	seq, highest, ok, _ = s.AcceptMode(key, writer, ModePlain, token)
	return seq, highest, ok
}

// AcceptMode applies the rule of mode (package doc, Modes) to a write and
// records it if accepted. It returns the acceptance sequence number, or ok
// false and the token that refused it (0 for a slot that is not a holder);
// err is set, and nothing recorded, when a slot's holders could not be
// read or the mode is unknown.
func (s *Server) AcceptMode(key, writer, mode string, token uint64) (seq uint64, highest uint64, ok bool, err error) {
	switch mode {
	case ModePlain:
		if s.cfg.CheckTokens && s.cfg.PGFence != nil {
			return s.acceptPG(key, writer, token)
		}
	case ModeExclusive, ModeShared:
	case ModeSlot:
		if s.cfg.CheckTokens {
			s.slotMu.Lock()
			defer s.slotMu.Unlock()
			holding, err := s.isSlotHolder(key, token)
			if err != nil {
				return 0, 0, false, err
			}
			if !holding {
				s.mu.Lock()
				s.rejected++
				s.mu.Unlock()
				return 0, 0, false, nil
			}
		}
	default:
		return 0, 0, false, fmt.Errorf("fenced: unknown mode %q", mode)
	}
	at := s.cfg.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	h, x := s.highest[key], s.excl[key]
	if s.cfg.CheckTokens {
		bar := h // plain and exclusive: above every grant written so far
		switch mode {
		case ModeShared:
			bar = x // shared: above every exclusive grant written so far
		case ModeSlot:
			bar = 0 // checked above
		}
		if token < bar {
			s.rejected++
			return 0, bar, false, nil
		}
	}
	s.highest[key] = max(h, token)
	if mode == ModeExclusive {
		s.excl[key] = max(x, token)
	}
	seq = uint64(len(s.writes)) + 1
	s.writes = append(s.writes, Write{Seq: seq, Key: key, Writer: writer, Token: token, Mode: mode, At: at})
	return seq, 0, true, nil
}

// pgFenceTimeout bounds one write's transaction through the PostgreSQL
// fence.
const pgFenceTimeout = 5 * time.Second

// acceptPG is AcceptMode of a plain write through the PostgreSQL fence:
// one transaction calling lockd_fence_check (fencepg.Check), recorded once
// it committed.
func (s *Server) acceptPG(key, writer string, token uint64) (seq uint64, highest uint64, ok bool, err error) {
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), pgFenceTimeout)
	defer cancel()
	err = pgx.BeginFunc(ctx, s.cfg.PGFence, func(tx pgx.Tx) error {
		return fencepg.Check(ctx, tx, key, token)
	})
	if se, stale := errors.AsType[*fence.StaleError](err); stale {
		s.mu.Lock()
		s.rejected++
		s.pgRejected++
		s.mu.Unlock()
		return 0, se.HighWater, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("fenced: PostgreSQL fence: %w", err)
	}
	at := s.cfg.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.highest[key] = max(s.highest[key], token)
	seq = uint64(len(s.writes)) + 1
	s.writes = append(s.writes, Write{Seq: seq, Key: key, Writer: writer, Token: token, Mode: ModePlain, At: at})
	return seq, 0, true, nil
}

// isSlotHolder asks SlotCheck, else SlotHolders, whether token holds a
// slot of key now.
func (s *Server) isSlotHolder(key string, token uint64) (bool, error) {
	if s.cfg.SlotCheck != nil {
		ctx, cancel := context.WithTimeout(context.Background(), slotCheckTimeout)
		defer cancel()
		current, err := s.cfg.SlotCheck(ctx, key, token)
		if err != nil {
			return false, fmt.Errorf("fenced: check %q: %w", key, err)
		}
		return current, nil
	}
	if s.cfg.SlotHolders == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), slotCheckTimeout)
	defer cancel()
	tokens, err := s.cfg.SlotHolders(ctx, key)
	if err != nil {
		return false, fmt.Errorf("fenced: holders of %q: %w", key, err)
	}
	return slices.Contains(tokens, token), nil
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

// RejectedByPG returns how many of the refused writes the PostgreSQL
// fence (Config.PGFence) refused.
func (s *Server) RejectedByPG() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pgRejected
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
	switch req.Mode {
	case ModePlain, ModeExclusive, ModeShared, ModeSlot:
	default:
		http.Error(w, "fenced: bad request: unknown mode "+strconv.Quote(req.Mode), http.StatusBadRequest)
		return
	}
	seq, highest, ok, err := s.AcceptMode(req.Key, req.Writer, req.Mode, req.Token)
	if err != nil {
		// The write was not applied; the writer cannot tell (unknown).
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
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
