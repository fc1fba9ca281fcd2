package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Key describes one C5 configuration key and every name it goes by.
type Key struct {
	// Name is the key, e.g. lock.session.ttl; it is also the YAML path.
	Name string
	// Env is the environment variable, e.g. LOCKD_SESSION_TTL.
	Env string
	// Flag is the command-line flag without its dashes, e.g. session-ttl.
	Flag string
	// Usage is the flag's help text.
	Usage string

	kind  kind
	index []int // of the Config field tagged with Name (part, field)
}

type kind int

const (
	kindString kind = iota + 1
	kindDuration
	kindBool
	kindList
	kindInt
	kindFloat
)

var kindTypes = [...]string{kindString: "string", kindDuration: "duration", kindBool: "bool", kindList: "strings", kindInt: "int", kindFloat: "float"}

// keyTable is the C5 table in documentation order. Env names follow the rule
// (envName); flag names are chosen for the command line.
var keyTable = []struct{ name, flag, usage string }{
	{"lock.backend", "backend", "backend: embedded, etcd or pg"},
	{"lock.session.ttl", "session-ttl", "TTL of sessions opened without one (2s..1h)"},
	{"lock.client.safety-margin", "safety-margin", "how long before the backend could free a key a client stops trusting it (< ttl/2)"},
	{"lock.client.heartbeat-interval", "heartbeat-interval", "client keepalive interval; 0 means ttl/3"},
	{"lock.server.listen", "listen", "gRPC listen address"},
	{"lock.server.metrics-listen", "metrics-listen", `/metrics and /healthz listen address, or "off"`},
	{"lock.server.http.listen", "http-listen", "HTTP/JSON API listen address (empty: off; TLS from --tls-*)"},
	{"lock.server.http.console", "http-console", "serve the read-only web console under /console/ on --http-listen"},
	{"lock.server.stats.templates", "stats-templates", "key templates of the per-template statistics, e.g. jobs/*,tenants/*/report (at most 32; empty: the first path segment)"},
	{"lock.server.stats.enabled", "stats-enabled", "keep the per-template statistics and the hot keys (false: neither)"},
	// Tracing (C5 #ct5-tracing).
	{"lock.server.tracing.enabled", "tracing-enabled", "record OpenTelemetry traces and export them over OTLP"},
	{"lock.server.tracing.otlp-endpoint", "tracing-otlp-endpoint", "host:port of the OTLP collector (empty: localhost:4317 for grpc, localhost:4318 for http)"},
	{"lock.server.tracing.otlp-protocol", "tracing-otlp-protocol", "OTLP protocol: grpc or http"},
	{"lock.server.tracing.otlp-insecure", "tracing-otlp-insecure", "plaintext to the OTLP collector (default: TLS)"},
	{"lock.server.tracing.otlp-ca-file", "tracing-otlp-ca-file", "PEM CA bundle of the OTLP collector's certificate (default: the system roots)"},
	{"lock.server.tracing.sample-ratio", "tracing-sample-ratio", "share of the traces lockd starts that are kept (0..1; a caller's traceparent decides for its calls)"},
	{"lock.server.close-sessions-on-shutdown", "close-sessions-on-shutdown", "on SIGINT/SIGTERM close every session (releasing its locks) instead of leaving them to expire"},
	{"lock.server.drain-timeout", "drain-timeout", "on SIGINT/SIGTERM, how long to tell clients to move to another replica and wait for them (0: no drain)"},
	// Transport security of the listeners (C5 #ct5-tls).
	{"lock.server.tls.cert-file", "tls-cert-file", "PEM certificate of the gRPC listener (turns TLS on; with --tls-key-file)"},
	{"lock.server.tls.key-file", "tls-key-file", "PEM private key of --tls-cert-file"},
	{"lock.server.tls.client-ca-file", "tls-client-ca-file", "PEM CA bundle client certificates must chain to (mTLS)"},
	{"lock.server.tls.client-auth", "tls-client-auth", "none, request or require (unset: require with --tls-client-ca-file, else none)"},
	{"lock.server.metrics-tls.cert-file", "metrics-tls-cert-file", "PEM certificate of the metrics listener (turns TLS on)"},
	{"lock.server.metrics-tls.key-file", "metrics-tls-key-file", "PEM private key of --metrics-tls-cert-file"},
	{"lock.server.metrics-tls.client-ca-file", "metrics-tls-client-ca-file", "PEM CA bundle metrics clients' certificates must chain to"},
	{"lock.server.metrics-tls.client-auth", "metrics-tls-client-auth", "none, request or require, for the metrics listener"},
	{"lock.server.insecure-allow-remote", "insecure-allow-remote", "allow a non-loopback listener without TLS (logged at every start)"},
	{"lock.etcd.endpoints", "etcd-endpoints", "etcd endpoints, comma-separated (backend etcd)"},
	{"lock.etcd.prefix", "etcd-prefix", "prefix of every etcd key lockd writes (ends with /)"},
	{"lock.etcd.dial-timeout", "etcd-dial-timeout", "etcd dial timeout (100ms..1m)"},
	{"lock.etcd.auto-sync-interval", "etcd-auto-sync-interval", "how often to replace the etcd endpoints with the cluster's member list (0: off; 1s..1h)"},
	// Transport security of the external etcd (C5 #ct5-tls).
	{"lock.etcd.tls.ca-file", "etcd-tls-ca-file", "PEM CA bundle of the etcd servers (https:// endpoints)"},
	{"lock.etcd.tls.cert-file", "etcd-tls-cert-file", "PEM client certificate for etcd (with --etcd-tls-key-file)"},
	{"lock.etcd.tls.key-file", "etcd-tls-key-file", "PEM private key of --etcd-tls-cert-file"},
	{"lock.etcd.username", "etcd-username", "etcd user (with --etcd-password-file)"},
	{"lock.etcd.password-file", "etcd-password-file", "file holding the etcd user's password"},
	{"lock.pg.dsn", "pg-dsn", "PostgreSQL connection string (backend pg)"},
	{"lock.pg.dsn-file", "pg-dsn-file", "file holding the PostgreSQL connection string (keeps its password out of ps)"},
	{"lock.pg.schema", "pg-schema", "PostgreSQL schema for lockd's tables"},
	{"lock.pg.reaper-interval", "pg-reaper-interval", "how often expired PostgreSQL sessions are reaped (100ms..1m)"},
	{"lock.pg.max-conns", "pg-max-conns", "size of lockd's PostgreSQL connection pool (1..1000; 0: the DSN's pool_max_conns)"},
	{"lock.embedded.data-dir", "data-dir", "data directory of the embedded etcd (backend embedded)"},
	{"lock.embedded.quota-bytes", "embedded-quota-bytes", "backend quota of the embedded etcd in bytes (16 MiB..8 GiB)"},
	{"lock.embedded.compaction-retain-revisions", "embedded-compaction-retain-revisions", "compact the embedded etcd every 10s to the current revision minus this many; 0: only hourly"},
	// Limits (#ct5-limits).
	{"lock.session.max-ttl", "session-max-ttl", "longest session TTL a client may ask for (lock.session.ttl..1h)"},
	{"lock.server.max-sessions", "max-sessions", "sessions this server keeps; on etcd each is a kept-alive lease"},
	{"lock.server.max-session-opens", "max-session-opens", "OpenSession calls in progress at once; more are refused"},
	{"lock.server.max-connections", "max-connections", "client connections whose RPCs are served"},
	{"lock.server.max-streams", "max-streams", "KeepAlive and Watch streams open at once"},
	{"lock.server.max-watches", "max-watches", "Watch streams open at once"},
	{"lock.server.max-waiters", "max-waiters", "acquires waiting at once"},
	{"lock.server.max-waiters-per-key", "max-waiters-per-key", "acquires waiting at once for one key"},
	{"lock.server.max-locks-per-session", "max-locks-per-session", "keys one session holds or is acquiring through this server"},
	{"lock.server.refusal-rate", "refusal-rate", "calls per second one peer gets refused for access before refusals are answered LIMIT; 0: off"},
	{"lock.server.max-lock-delay", "max-lock-delay", "longest lock-delay an Acquire may ask for (0..1h; 0 refuses lock-delays)"},
	{"lock.server.max-hold-limit", "max-hold-limit", "longest maximum hold an Acquire may ask for (0 or 1s..168h; 0 refuses it)"},
	// Idle and unauthorised connections (#ct5-idle).
	{"lock.server.conn-auth-timeout", "conn-auth-timeout", "close a connection that made no authorised call this long after it was accepted (1s..10m)"},
	{"lock.server.idle-timeout", "idle-timeout", "close a connection with no call in progress this long (10s..24h)"},
	{"lock.server.http.read-header-timeout", "http-read-header-timeout", "bound of an HTTP request's headers (and the TLS handshake) (1s..1m)"},
	// Per-principal shares (#ct5-principal-limits).
	{"lock.server.principal.max-streams", "principal-max-streams", "KeepAlive and Watch streams one principal may hold under a policy (0: 25% of --max-streams)"},
	{"lock.server.principal.max-watches", "principal-max-watches", "Watch streams one principal may hold under a policy (0: 25% of --max-watches)"},
	{"lock.server.principal.max-sessions", "principal-max-sessions", "sessions one principal may keep under a policy (0: 25% of --max-sessions)"},
	{"lock.server.principal.max-connections", "principal-max-connections", "connections one principal may hold under a policy (0: 25% of --max-connections)"},
	{"lock.server.principal.max-waiters", "principal-max-waiters", "waiting acquires one principal may have under a policy (0: 25% of --max-waiters)"},
	{"lock.server.principal.max-inflight", "principal-max-inflight", "unary calls one principal may have in progress under a policy (0: 4 × --max-connections)"},
	{"lock.server.principal.max-session-opens", "principal-max-session-opens", "sessions one principal may open per second under a policy (0: 25% of --max-session-opens)"},
	// Access control (C5 #ct5-auth).
	{"lock.auth.policy-file", "auth-policy-file", "YAML access policy (rules of principals, prefixes, actions); unset: every call allowed"},
	{"lock.auth.tokens-file", "auth-tokens-file", "bearer tokens: SHA-256 of each token and its principal (needs --auth-policy-file)"},
}

// reservedEnv are LOCKD_ variables that are not configuration.
var reservedEnv = map[string]bool{"LOCKD_SERVER": true, "LOCKD_KEY": true, "LOCKD_FENCING_TOKEN": true, "LOCKD_OWNER": true,
	// The client commands' TLS settings (C5 #ct5-tls).
	"LOCKD_TLS_CA": true, "LOCKD_TLS_CERT": true, "LOCKD_TLS_KEY": true, "LOCKD_TLS_SERVER_NAME": true,
	// The client commands' bearer token file (C5 #ct5-auth).
	"LOCKD_TOKEN_FILE": true,
	// lockd run --all's (C5 #ct5-run-keys); LOCKD_KEY_<n> and
	// LOCKD_FENCING_TOKEN_<n> are reservedRunPrefixes.
	"LOCKD_KEY_COUNT": true, "LOCKD_FENCING_TOKENS": true}

// reservedRunPrefixes start the numbered variables of lockd run --all.
var reservedRunPrefixes = []string{"LOCKD_KEY_", "LOCKD_FENCING_TOKEN_"}

// reserved reports whether the LOCKD_ variable name is not configuration.
func reserved(name string) bool {
	if reservedEnv[name] || strings.HasPrefix(name, reservedEnvPrefix) {
		return true
	}
	for _, p := range reservedRunPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

const (
	envPrefix         = "LOCKD_"
	reservedEnvPrefix = "LOCKD_TEST_"
)

var (
	keys      []Key
	keyByName = map[string]*Key{}
	keyByEnv  = map[string]*Key{}
	keyByFlag = map[string]*Key{}
	// sections are the proper prefixes of keys ("lock", "lock.session"), which
	// a YAML file may leave null or empty.
	sections = map[string]bool{}
)

func init() {
	type field struct {
		typ   reflect.Type
		index []int
	}
	fields := map[string]field{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		part := t.Field(i).Type
		for j := range part.NumField() {
			f := part.Field(j)
			if tag := f.Tag.Get("koanf"); tag != "" {
				if _, dup := fields[tag]; dup {
					panic("config: two Config fields for key " + tag)
				}
				fields[tag] = field{f.Type, []int{i, j}}
			}
		}
	}
	if len(fields) != len(keyTable) {
		panic(fmt.Sprintf("config: Config has %d keys, the C5 table %d", len(fields), len(keyTable)))
	}
	keys = make([]Key, len(keyTable))
	for i, e := range keyTable {
		f, ok := fields[e.name]
		if !ok {
			panic("config: no Config field for key " + e.name)
		}
		k := &keys[i]
		*k = Key{Name: e.name, Env: envName(e.name), Flag: e.flag, Usage: e.usage, kind: kindOf(f.typ), index: f.index}
		if k.kind == 0 {
			panic(fmt.Sprintf("config: key %s has unsupported type %v", e.name, f.typ))
		}
		keyByName[k.Name], keyByEnv[k.Env], keyByFlag[k.Flag] = k, k, k
		for p := k.Name; ; {
			i := strings.LastIndexByte(p, '.')
			if i < 0 {
				break
			}
			p = p[:i]
			sections[p] = true
		}
	}
}

func kindOf(t reflect.Type) kind {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return kindDuration
	case t.Kind() == reflect.String:
		return kindString
	case t.Kind() == reflect.Bool:
		return kindBool
	case t.Kind() == reflect.Int64, t.Kind() == reflect.Int:
		return kindInt
	case t.Kind() == reflect.Float64:
		return kindFloat
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return kindList
	}
	return 0
}

// envName is the C5 rule: LOCKD_ + the key without "lock.", upper-cased,
// "." and "-" replaced by "_".
func envName(key string) string {
	s := strings.ToUpper(strings.TrimPrefix(key, "lock."))
	return envPrefix + strings.NewReplacer(".", "_", "-", "_").Replace(s)
}

// Keys returns every C5 key in documentation order.
func Keys() []Key { return append([]Key(nil), keys...) }

// get returns the value of k's field in c.
func (k *Key) get(c *Config) any {
	return reflect.ValueOf(c).Elem().FieldByIndex(k.index).Interface()
}

// set stores v, already of k's type, in c.
func (k *Key) set(c *Config, v any) {
	f := reflect.ValueOf(c).Elem().FieldByIndex(k.index)
	if n, ok := v.(int64); ok && f.Kind() == reflect.Int {
		f.SetInt(n) // integer keys parse to int64; limits are ints (bounds checked by Validate)
		return
	}
	f.Set(reflect.ValueOf(v))
}
