package testkit

import (
	"os"
	"strings"
)

// ChildEnv is this process's environment without the variables whose names
// start with one of drop (e.g. "LOCKD_", which lockd would read as
// configuration, or "PG", which would redirect PostgreSQL's tools), followed
// by extra ("NAME=value" each).
func ChildEnv(drop []string, extra ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range drop {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
