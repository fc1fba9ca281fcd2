package config

import (
	"errors"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/server"
)

// Config is the C5 configuration split by who reads it: each key is a field
// of exactly one part, with the key in the field's koanf tag.
type Config struct {
	// Server holds the server's keys (lock.session.*, lock.client.*,
	// lock.server.*), for server.New.
	Server server.Config
	// Backend holds the backend's keys (lock.backend, lock.etcd.*,
	// lock.pg.*, lock.embedded.*), for backend.Open.
	Backend backend.Config
	// Auth holds the access-control keys (lock.auth.*), for auth.New.
	Auth auth.Config
}

// DefaultConfig returns the C5 defaults of every part.
func DefaultConfig() Config {
	return Config{Server: server.DefaultConfig(), Backend: backend.DefaultConfig(), Auth: auth.DefaultConfig()}
}

// Validate checks every part. Each error is "key: message", one per
// problem, joined.
func (c Config) Validate() error {
	return errors.Join(c.Server.Validate(), c.Backend.Validate(), c.Auth.Validate())
}
