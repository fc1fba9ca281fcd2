package config

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors, matched with errors.Is through a *KeyError.
var (
	// ErrUnknownKey: a file key or a LOCKD_* variable that names no C5 key.
	ErrUnknownKey = errors.New("unknown configuration key")
	// ErrSyntax: the configuration file is not a YAML mapping.
	ErrSyntax = errors.New("config file is not valid YAML")
)

// KeyError is a configuration error about one key. Load returns one per
// problem, joined with errors.Join.
type KeyError struct {
	// Key is the C5 key, or the unknown name as it was written (a file key
	// path or a LOCKD_* variable).
	Key string
	// Source says where the value came from: "file lockd.yaml",
	// "env LOCKD_SESSION_TTL", "flag --session-ttl", "default"; empty when
	// the error concerns the combination of several keys' final values.
	Source string
	// Err is what is wrong.
	Err error
}

func (e *KeyError) Error() string {
	name := e.Key
	if _, ok := keyByName[name]; !ok {
		name = strconv.Quote(name)
	}
	if e.Source != "" {
		return fmt.Sprintf("%s (%s): %v", name, e.Source, e.Err)
	}
	return fmt.Sprintf("%s: %v", name, e.Err)
}

func (e *KeyError) Unwrap() error { return e.Err }

// syntaxError: the file is not a YAML mapping. It matches ErrSyntax.
type syntaxError struct {
	source string
	err    error
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("%s: %v: %v", e.source, ErrSyntax, e.err)
}

func (e *syntaxError) Is(target error) bool { return target == ErrSyntax }
func (e *syntaxError) Unwrap() error        { return e.err }
