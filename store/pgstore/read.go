package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Inspect implements store.LockStore. Holder and waiters come from one
// statement, so one snapshot.
func (s *Store) Inspect(ctx context.Context, key string) (_ store.LockInfo, _ bool, err error) {
	if err := store.ValidateKey(key); err != nil {
		return store.LockInfo{}, false, fmt.Errorf("pgstore: inspect: %w", err)
	}
	if err := s.begin(ctx, "inspect"); err != nil {
		return store.LockInfo{}, false, err
	}
	defer s.metrics.Observe(telemetry.OpInspect)(&err)
	info := store.LockInfo{Key: key}
	var sid string
	var tok int64
	var waiters []string
	var labels, value []byte
	var delayMS int64
	err = s.pool.QueryRow(ctx, s.q.inspect, key).Scan(&sid, &tok, &info.AcquiredAt, &waiters, &info.Owner, &labels, &value, &delayMS)
	if errors.Is(err, pgx.ErrNoRows) {
		// A semaphore or read/write key (multi.go), or free, perhaps with a
		// lock-delay running (delay.go).
		if info, found, err := s.inspectSlots(ctx, key); err != nil || found {
			return info, found, err
		}
		return s.inspectFree(ctx, key)
	}
	if err = classify(ctx, "inspect", err); err != nil {
		return store.LockInfo{}, false, err
	}
	info.Session, info.Token, info.Waiters = store.SessionID(sid), uint64(tok), sessionIDs(waiters)
	info.Labels, info.Value = decodeLabels(labels), cloneValue(value)
	info.LockDelay = time.Duration(delayMS) * time.Millisecond
	return info, true, nil
}

// List implements store.LockStore.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) (_ []store.LockInfo, err error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	if after != "" {
		if err := store.ValidateKey(after); err != nil {
			return nil, fmt.Errorf("pgstore: list: after: %w", err)
		}
	}
	if limit, err = store.ListLimit(limit); err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	if err := s.begin(ctx, "list"); err != nil {
		return nil, err
	}
	defer s.metrics.Observe(telemetry.OpList)(&err)
	var end *string
	if e, ok := prefixEnd(prefix); ok {
		end = &e
	}
	infos := []store.LockInfo{}
	rows, err := s.pool.Query(ctx, s.q.list, prefix, end, after, limit)
	if err == nil {
		var info store.LockInfo
		var sid string
		var tok int64
		var waiters []string
		var labels, value []byte
		var delayMS int64
		_, err = pgx.ForEachRow(rows, []any{&info.Key, &sid, &tok, &info.AcquiredAt, &waiters, &info.Owner, &labels, &value, &delayMS}, func() error {
			info.Session, info.Token, info.Waiters = store.SessionID(sid), uint64(tok), sessionIDs(waiters)
			info.LockDelay = time.Duration(delayMS) * time.Millisecond
			info.Labels, info.Value = decodeLabels(labels), cloneValue(value)
			infos = append(infos, info)
			return nil
		})
	}
	if err = classify(ctx, "list", err); err != nil {
		return nil, err
	}
	return s.mergeSlots(ctx, infos, prefix, end, after, limit) // multi.go
}

// decodeLabels decodes a labels column (a JSON object); nil when empty.
func decodeLabels(b []byte) map[string]string {
	var m map[string]string
	if json.Unmarshal(b, &m) != nil || len(m) == 0 {
		return nil
	}
	return m
}

// cloneValue copies a scanned value (the scan buffer is reused); nil when
// empty.
func cloneValue(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return bytes.Clone(b)
}

func sessionIDs(ss []string) []store.SessionID {
	ids := make([]store.SessionID, len(ss))
	for i, s := range ss {
		ids[i] = store.SessionID(s)
	}
	return ids
}

// prefixEnd returns the smallest string greater than every string that
// starts with prefix, in code point order (which is UTF-8 byte order, and so
// COLLATE "C" order), or false if there is none (empty prefix, or only
// U+10FFFF). The result is valid UTF-8, as PostgreSQL text must be.
func prefixEnd(prefix string) (string, bool) {
	runes := []rune(prefix)
	for i := len(runes) - 1; i >= 0; i-- {
		r := runes[i] + 1
		if r == 0xD800 { // skip the surrogates, which UTF-8 cannot encode
			r = 0xE000
		}
		if r <= unicode.MaxRune {
			runes[i] = r
			return string(runes[:i+1]), true
		}
	}
	return "", false
}
