package fence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

var (
	// ErrStale: the write's token is below the key's high-water mark. The
	// error is a *StaleError.
	ErrStale = errors.New("fence: stale token")
	// ErrInvalid: an empty key, token 0, or a token above 2⁶³−1.
	ErrInvalid = errors.New("fence: invalid key or token")
)

// StaleError is a refused write: Token is below HighWater, the highest
// token accepted for Key. It matches ErrStale.
type StaleError struct {
	Key       string
	Token     uint64
	HighWater uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale token %d for key %q: the resource has accepted token %d", e.Token, e.Key, e.HighWater)
}

// Is makes a *StaleError match ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Validate checks a key and token: ErrInvalid for an empty key, token 0
// or a token above math.MaxInt64 (the mark is a signed 64-bit integer in
// SQL; lockd's tokens are about 1.8·10¹⁵, C2 #ct2-fencing).
func Validate(key string, token uint64) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case token == 0:
		return fmt.Errorf("%w: token 0 is no grant's token", ErrInvalid)
	case token > math.MaxInt64:
		return fmt.Errorf("%w: token %d is above 2^63-1", ErrInvalid, token)
	}
	return nil
}

// Store keeps the high-water mark of each key. Advance applies the rule
// atomically per key: nil when token is at or above the key's mark (which
// it then raises to token), a *StaleError when it is below (nothing
// changes), ErrInvalid for bad input, any other error when the store
// failed (the write must then not happen). Safe for concurrent use.
type Store interface {
	Advance(ctx context.Context, key string, token uint64) error
}

// MemoryStore is a Store in process memory: marks are lost when the process
// ends, so use it only where the resource itself is in the same process
// and forgets its state with it. The zero value is ready.
type MemoryStore struct {
	mu   sync.Mutex
	high map[string]uint64
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Advance implements Store.
func (m *MemoryStore) Advance(_ context.Context, key string, token uint64) error {
	if err := Validate(key, token); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.high[key]; token < h {
		return &StaleError{Key: key, Token: token, HighWater: h}
	}
	if m.high == nil {
		m.high = make(map[string]uint64)
	}
	m.high[key] = token
	return nil
}

// HighWater returns the key's mark, 0 if none.
func (m *MemoryStore) HighWater(key string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.high[key]
}
