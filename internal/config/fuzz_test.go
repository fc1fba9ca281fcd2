package config

import (
	"errors"
	"testing"
)

// FuzzLoadYAML feeds arbitrary bytes as the configuration file. Load must
// not panic; a success must validate; every error must be either a YAML
// syntax error or a *KeyError naming a key.
func FuzzLoadYAML(f *testing.F) {
	f.Add([]byte("lock:\n  session:\n    ttl: 15s\n"))
	f.Add([]byte("lock.etcd.endpoints: [a:1, b:2]\nlock:\n  backend: etcd\n"))
	f.Add([]byte("lock: {client: {safety-margin: 9s}}\n"))
	f.Add([]byte("foo: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := load(sources{file: data, fileName: "fuzz.yaml"})
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("load succeeded with a config that fails Validate: %v", verr)
			}
			return
		}
		for _, leaf := range leaves(err) {
			var ke *KeyError
			switch {
			case errors.Is(leaf, ErrSyntax):
			case errors.As(leaf, &ke):
				if ke.Error() == "" || ke.Err == nil {
					t.Fatalf("KeyError without a key or a cause: %#v", ke)
				}
			default:
				t.Fatalf("error %q (%T) names no key", leaf, leaf)
			}
		}
	})
}

// leaves splits the flat errors.Join that load returns.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
