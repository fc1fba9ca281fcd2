package tlsreload

import (
	"log/slog"
	"os"
	"slices"
	"sync"

	"lock.dev/lockd/internal/telemetry"
)

// Reloader holds a value of type T loaded from a set of files (a
// tls.Config, a key pair and a CA pool, …). Current re-loads it when the
// files' modification time or size has changed since the last load;
// Reload re-loads it unconditionally (SIGHUP). A version that fails to
// load keeps the previous value in force and logs tls_reload_failed once
// per version; a version that takes effect after the first logs
// tls_reloaded. It is safe for concurrent use.
type Reloader[T any] struct {
	label string // C4 listener label of the events
	paths []string
	load  func() (T, error)
	log   *slog.Logger

	mu     sync.Mutex
	cur    T
	loaded stamp // of the files in cur
	failed stamp // of the last files that failed to load; nil: none
}

// stamp identifies a version of the files: the modification time and size
// of each (zero for an unset or unreadable one).
type stamp []fileStamp

type fileStamp struct {
	modNanos int64
	size     int64
}

// New loads the value with load (its error is returned as is: it should
// name the configuration key of the file that failed) and returns a
// reloader for it. paths are the files load reads ("" entries are
// ignored); label is the C4 listener label of the reload events
// (telemetry.ListenerGRPC …); logger nil discards them.
func New[T any](label string, paths []string, load func() (T, error), logger *slog.Logger) (*Reloader[T], error) {
	r := &Reloader[T]{label: label, paths: slices.Clone(paths), load: load, log: telemetry.OrDiscard(logger)}
	st := r.stat()
	v, err := load()
	if err != nil {
		return nil, err
	}
	r.cur, r.loaded = v, st
	return r, nil
}

// Current returns the value in force, re-loading it first if the files
// changed on disk since it was loaded (and since the last version that
// failed). Call it where a new connection needs the material (at each
// TLS handshake).
func (r *Reloader[T]) Current() T {
	st := r.stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(st, r.loaded) && !slices.Equal(st, r.failed) {
		_ = r.reloadLocked(st)
	}
	return r.cur
}

// Reload re-reads the files now, changed or not. On error the previous
// value stays in force (and the error is logged as tls_reload_failed).
func (r *Reloader[T]) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked(r.stat())
}

func (r *Reloader[T]) reloadLocked(st stamp) error {
	v, err := r.load()
	if err != nil {
		if !slices.Equal(st, r.failed) {
			telemetry.TLSReloadFailed(r.log, r.label, err)
		}
		r.failed = st
		return err
	}
	r.cur, r.loaded, r.failed = v, st, nil
	telemetry.TLSReloaded(r.log, r.label)
	return nil
}

func (r *Reloader[T]) stat() stamp {
	st := make(stamp, len(r.paths))
	for i, name := range r.paths {
		if name == "" {
			continue
		}
		if fi, err := os.Stat(name); err == nil {
			st[i] = fileStamp{modNanos: fi.ModTime().UnixNano(), size: fi.Size()}
		}
	}
	return st
}
