package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// loadArgs runs Load the way lockd serve does: flags registered and parsed
// from args, the file (if any) written to a temp dir and passed by --config.
func loadArgs(t *testing.T, yamlText string, env []string, args ...string) (Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	if yamlText != "" {
		path := filepath.Join(t.TempDir(), "lockd.yaml")
		if err := os.WriteFile(path, []byte(yamlText), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse flags %q: %v", args, err)
	}
	return Load(fs, func() []string { return env })
}

func TestDefaults(t *testing.T) {
	cfg, err := loadArgs(t, "", nil)
	if err != nil {
		t.Fatalf("Load with no sources: %v", err)
	}
	if want := DefaultConfig(); !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load with no sources = %+v, want the defaults %+v", cfg, want)
	}
	cfg, err = Load(nil, func() []string { return nil })
	if err != nil || !reflect.DeepEqual(cfg, DefaultConfig()) {
		t.Errorf("Load(nil, empty env) = %+v, %v; want the defaults", cfg, err)
	}
}

func TestPrecedence(t *testing.T) {
	const file = "lock:\n  session:\n    ttl: 20s\n  server:\n    listen: 127.0.0.11:1\n"
	tests := []struct {
		name     string
		file     string
		env      []string
		args     []string
		wantTTL  time.Duration
		wantAddr string
	}{
		{"defaults", "", nil, nil, 15 * time.Second, "127.0.0.1:7420"},
		{"file over defaults", file, nil, nil, 20 * time.Second, "127.0.0.11:1"},
		{"env over file", file, []string{"LOCKD_SESSION_TTL=30s"}, nil, 30 * time.Second, "127.0.0.11:1"},
		{"flag over env", file, []string{"LOCKD_SESSION_TTL=30s", "LOCKD_SERVER_LISTEN=127.0.0.12:1"},
			[]string{"--session-ttl", "40s"}, 40 * time.Second, "127.0.0.12:1"},
		{"flag over file", file, nil, []string{"--listen=127.0.0.13:1"}, 20 * time.Second, "127.0.0.13:1"},
		{"empty env is unset", file, []string{"LOCKD_SESSION_TTL="}, nil, 20 * time.Second, "127.0.0.11:1"},
		{"unset flag does not override", file, []string{"LOCKD_SESSION_TTL=30s"}, []string{"--backend", "embedded"},
			30 * time.Second, "127.0.0.11:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadArgs(t, tt.file, tt.env, tt.args...)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if cfg.Server.SessionTTL != tt.wantTTL || cfg.Server.Listen != tt.wantAddr {
				t.Errorf("Load: ttl=%v listen=%q, want ttl=%v listen=%q", cfg.Server.SessionTTL, cfg.Server.Listen, tt.wantTTL, tt.wantAddr)
			}
		})
	}
}

// TestEveryKeyEverySource sets each key to a non-default value through each
// source and checks it lands in the right field.
func TestEveryKeyEverySource(t *testing.T) {
	values := map[string]struct {
		text string // env / flag text
		yaml string // YAML value
		want any
	}{
		"lock.backend":                              {"pg", "pg", "pg"},
		"lock.session.ttl":                          {"30s", "30s", 30 * time.Second},
		"lock.client.safety-margin":                 {"3s", "3s", 3 * time.Second},
		"lock.client.heartbeat-interval":            {"2s", "2s", 2 * time.Second},
		"lock.server.listen":                        {"127.0.0.2:1", `"127.0.0.2:1"`, "127.0.0.2:1"},
		"lock.server.metrics-listen":                {"off", "off", "off"},
		"lock.server.http.listen":                   {"127.0.0.3:2", `"127.0.0.3:2"`, "127.0.0.3:2"},
		"lock.server.http.console":                  {"true", "true", true},
		"lock.server.stats.templates":               {"jobs/*, tenants/*/report", "[jobs/*, tenants/*/report]", []string{"jobs/*", "tenants/*/report"}},
		"lock.server.stats.enabled":                 {"false", "false", false},
		"lock.server.tracing.enabled":               {"true", "true", true},
		"lock.server.tracing.otlp-endpoint":         {"c:4317", "c:4317", "c:4317"},
		"lock.server.tracing.otlp-protocol":         {"http", "http", "http"},
		"lock.server.tracing.otlp-insecure":         {"true", "true", true},
		"lock.server.tracing.otlp-ca-file":          {"/oca.pem", "/oca.pem", "/oca.pem"},
		"lock.server.tracing.sample-ratio":          {"0.25", "0.25", 0.25},
		"lock.server.close-sessions-on-shutdown":    {"true", "true", true},
		"lock.server.drain-timeout":                 {"2s", "2s", 2 * time.Second},
		"lock.etcd.endpoints":                       {"a:1, b:2", "[a:1, b:2]", []string{"a:1", "b:2"}},
		"lock.etcd.prefix":                          {"/x/", "/x/", "/x/"},
		"lock.etcd.dial-timeout":                    {"1s", "1s", time.Second},
		"lock.etcd.auto-sync-interval":              {"0", "0", time.Duration(0)},
		"lock.pg.dsn":                               {"postgres://h/db", "postgres://h/db", "postgres://h/db"},
		"lock.pg.schema":                            {"other", "other", "other"},
		"lock.pg.reaper-interval":                   {"500ms", "500ms", 500 * time.Millisecond},
		"lock.pg.max-conns":                         {"40", "40", 40},
		"lock.embedded.data-dir":                    {"/tmp/d", "/tmp/d", "/tmp/d"},
		"lock.embedded.quota-bytes":                 {"67108864", "67108864", int64(64 << 20)},
		"lock.embedded.compaction-retain-revisions": {"5000", "5000", int64(5000)},
		// Limits (#ct5-limits).
		"lock.session.max-ttl":              {"30m", "30m", 30 * time.Minute},
		"lock.server.max-sessions":          {"500", "500", 500},
		"lock.server.max-session-opens":     {"4", "4", 4},
		"lock.server.max-connections":       {"10", "10", 10},
		"lock.server.max-streams":           {"400", `"400"`, 400},
		"lock.server.max-watches":           {"7", "7", 7},
		"lock.server.max-waiters":           {"300", "300", 300},
		"lock.server.max-waiters-per-key":   {"3", "3", 3},
		"lock.server.max-locks-per-session": {"9", "9", 9},
		"lock.server.refusal-rate":          {"0", "0", 0},
		"lock.server.max-lock-delay":        {"30s", "30s", 30 * time.Second},
		"lock.server.max-hold-limit":        {"2h", "2h", 2 * time.Hour},
		// Idle and unauthorised connections (#ct5-idle).
		"lock.server.conn-auth-timeout":           {"3s", "3s", 3 * time.Second},
		"lock.server.idle-timeout":                {"5m", "5m", 5 * time.Minute},
		"lock.server.http.read-header-timeout":    {"2s", "2s", 2 * time.Second},
		"lock.server.principal.max-streams":       {"5", "5", 5},
		"lock.server.principal.max-watches":       {"3", "3", 3},
		"lock.server.principal.max-sessions":      {"5", "5", 5},
		"lock.server.principal.max-connections":   {"6", "6", 6},
		"lock.server.principal.max-waiters":       {"7", "7", 7},
		"lock.server.principal.max-inflight":      {"8", "8", 8},
		"lock.server.principal.max-session-opens": {"9", "9", 9},
		// Transport security (C5 #ct5-tls); their partners are in needs.
		"lock.server.tls.cert-file":              {"/c.pem", "/c.pem", "/c.pem"},
		"lock.server.tls.key-file":               {"/k.pem", "/k.pem", "/k.pem"},
		"lock.server.tls.client-ca-file":         {"/ca.pem", "/ca.pem", "/ca.pem"},
		"lock.server.tls.client-auth":            {"request", "request", "request"},
		"lock.server.metrics-tls.cert-file":      {"/mc.pem", "/mc.pem", "/mc.pem"},
		"lock.server.metrics-tls.key-file":       {"/mk.pem", "/mk.pem", "/mk.pem"},
		"lock.server.metrics-tls.client-ca-file": {"/mca.pem", "/mca.pem", "/mca.pem"},
		"lock.server.metrics-tls.client-auth":    {"require", "require", "require"},
		"lock.server.insecure-allow-remote":      {"true", "true", true},
		"lock.etcd.tls.ca-file":                  {"/eca.pem", "/eca.pem", "/eca.pem"},
		"lock.etcd.tls.cert-file":                {"/ec.pem", "/ec.pem", "/ec.pem"},
		"lock.etcd.tls.key-file":                 {"/ek.pem", "/ek.pem", "/ek.pem"},
		"lock.etcd.username":                     {"lockd", "lockd", "lockd"},
		"lock.etcd.password-file":                {"/pw", "/pw", "/pw"},
		"lock.pg.dsn-file":                       {"/dsn", "/dsn", "/dsn"},
		"lock.auth.policy-file":                  {"/p.yaml", "/p.yaml", "/p.yaml"},
		"lock.auth.tokens-file":                  {"/t", "/t", "/t"},
	}
	// needs are the other keys a key is valid only with (set by env).
	etcd := []string{"LOCKD_BACKEND=etcd", "LOCKD_ETCD_ENDPOINTS=https://e:1"}
	serverTLS := []string{"LOCKD_SERVER_TLS_CERT_FILE=/c.pem", "LOCKD_SERVER_TLS_KEY_FILE=/k.pem"}
	metricsTLS := []string{"LOCKD_SERVER_METRICS_TLS_CERT_FILE=/mc.pem", "LOCKD_SERVER_METRICS_TLS_KEY_FILE=/mk.pem"}
	needs := map[string][]string{
		"lock.server.tls.cert-file":              {"LOCKD_SERVER_TLS_KEY_FILE=/k.pem"},
		"lock.server.tls.key-file":               {"LOCKD_SERVER_TLS_CERT_FILE=/c.pem"},
		"lock.server.tls.client-ca-file":         serverTLS,
		"lock.server.tls.client-auth":            append([]string{"LOCKD_SERVER_TLS_CLIENT_CA_FILE=/ca.pem"}, serverTLS...),
		"lock.server.metrics-tls.cert-file":      {"LOCKD_SERVER_METRICS_TLS_KEY_FILE=/mk.pem"},
		"lock.server.metrics-tls.key-file":       {"LOCKD_SERVER_METRICS_TLS_CERT_FILE=/mc.pem"},
		"lock.server.metrics-tls.client-ca-file": metricsTLS,
		"lock.server.metrics-tls.client-auth":    append([]string{"LOCKD_SERVER_METRICS_TLS_CLIENT_CA_FILE=/mca.pem"}, metricsTLS...),
		"lock.etcd.tls.ca-file":                  etcd,
		"lock.server.http.console":               {"LOCKD_SERVER_HTTP_LISTEN=127.0.0.1:0"},
		"lock.etcd.tls.cert-file":                append([]string{"LOCKD_ETCD_TLS_KEY_FILE=/ek.pem"}, etcd...),
		"lock.etcd.tls.key-file":                 append([]string{"LOCKD_ETCD_TLS_CERT_FILE=/ec.pem"}, etcd...),
		"lock.etcd.username":                     append([]string{"LOCKD_ETCD_PASSWORD_FILE=/pw"}, etcd...),
		"lock.etcd.password-file":                append([]string{"LOCKD_ETCD_USERNAME=lockd"}, etcd...),
	}
	if len(values) != len(Keys()) {
		t.Fatalf("test covers %d keys, C5 has %d", len(values), len(Keys()))
	}
	// lock.backend=pg needs a DSN and lock.auth.tokens-file a policy file;
	// give every run both so each value validates on its own.
	base := []string{"LOCKD_PG_DSN=postgres://base", "LOCKD_AUTH_POLICY_FILE=/base.yaml"}
	for _, key := range Keys() {
		v, ok := values[key.Name]
		if !ok {
			t.Fatalf("no test value for %s", key.Name)
		}
		check := func(t *testing.T, cfg Config, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := key.get(&cfg); !reflect.DeepEqual(got, v.want) {
				t.Errorf("%s = %#v, want %#v", key.Name, got, v.want)
			}
		}
		base := slices.DeleteFunc(slices.Clone(base), func(kv string) bool { return strings.HasPrefix(kv, key.Env+"=") })
		if key.Name == "lock.pg.dsn" || key.Name == "lock.pg.dsn-file" {
			base = nil
		}
		base = append(append([]string(nil), base...), needs[key.Name]...)
		t.Run(key.Name+"/env", func(t *testing.T) {
			cfg, err := loadArgs(t, "", append([]string{key.Env + "=" + v.text}, base...))
			check(t, cfg, err)
		})
		t.Run(key.Name+"/flag", func(t *testing.T) {
			cfg, err := loadArgs(t, "", base, "--"+key.Flag+"="+v.text)
			check(t, cfg, err)
		})
		t.Run(key.Name+"/yaml", func(t *testing.T) {
			cfg, err := loadArgs(t, nested(key.Name, v.yaml), base)
			check(t, cfg, err)
		})
		t.Run(key.Name+"/yaml-dotted", func(t *testing.T) {
			cfg, err := loadArgs(t, key.Name+": "+v.yaml+"\n", base)
			check(t, cfg, err)
		})
	}
}

// nested renders key: value as nested YAML.
func nested(key, value string) string {
	var b strings.Builder
	parts := strings.Split(key, ".")
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + value)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestNamingRules(t *testing.T) {
	want := map[string][2]string{
		"lock.backend":                              {"LOCKD_BACKEND", "backend"},
		"lock.session.ttl":                          {"LOCKD_SESSION_TTL", "session-ttl"},
		"lock.client.safety-margin":                 {"LOCKD_CLIENT_SAFETY_MARGIN", "safety-margin"},
		"lock.client.heartbeat-interval":            {"LOCKD_CLIENT_HEARTBEAT_INTERVAL", "heartbeat-interval"},
		"lock.server.listen":                        {"LOCKD_SERVER_LISTEN", "listen"},
		"lock.server.metrics-listen":                {"LOCKD_SERVER_METRICS_LISTEN", "metrics-listen"},
		"lock.server.http.listen":                   {"LOCKD_SERVER_HTTP_LISTEN", "http-listen"},
		"lock.server.http.console":                  {"LOCKD_SERVER_HTTP_CONSOLE", "http-console"},
		"lock.server.stats.templates":               {"LOCKD_SERVER_STATS_TEMPLATES", "stats-templates"},
		"lock.server.stats.enabled":                 {"LOCKD_SERVER_STATS_ENABLED", "stats-enabled"},
		"lock.server.tracing.enabled":               {"LOCKD_SERVER_TRACING_ENABLED", "tracing-enabled"},
		"lock.server.tracing.otlp-endpoint":         {"LOCKD_SERVER_TRACING_OTLP_ENDPOINT", "tracing-otlp-endpoint"},
		"lock.server.tracing.otlp-protocol":         {"LOCKD_SERVER_TRACING_OTLP_PROTOCOL", "tracing-otlp-protocol"},
		"lock.server.tracing.otlp-insecure":         {"LOCKD_SERVER_TRACING_OTLP_INSECURE", "tracing-otlp-insecure"},
		"lock.server.tracing.otlp-ca-file":          {"LOCKD_SERVER_TRACING_OTLP_CA_FILE", "tracing-otlp-ca-file"},
		"lock.server.tracing.sample-ratio":          {"LOCKD_SERVER_TRACING_SAMPLE_RATIO", "tracing-sample-ratio"},
		"lock.server.close-sessions-on-shutdown":    {"LOCKD_SERVER_CLOSE_SESSIONS_ON_SHUTDOWN", "close-sessions-on-shutdown"},
		"lock.server.drain-timeout":                 {"LOCKD_SERVER_DRAIN_TIMEOUT", "drain-timeout"},
		"lock.etcd.endpoints":                       {"LOCKD_ETCD_ENDPOINTS", "etcd-endpoints"},
		"lock.etcd.prefix":                          {"LOCKD_ETCD_PREFIX", "etcd-prefix"},
		"lock.etcd.dial-timeout":                    {"LOCKD_ETCD_DIAL_TIMEOUT", "etcd-dial-timeout"},
		"lock.etcd.auto-sync-interval":              {"LOCKD_ETCD_AUTO_SYNC_INTERVAL", "etcd-auto-sync-interval"},
		"lock.pg.dsn":                               {"LOCKD_PG_DSN", "pg-dsn"},
		"lock.pg.schema":                            {"LOCKD_PG_SCHEMA", "pg-schema"},
		"lock.pg.reaper-interval":                   {"LOCKD_PG_REAPER_INTERVAL", "pg-reaper-interval"},
		"lock.pg.max-conns":                         {"LOCKD_PG_MAX_CONNS", "pg-max-conns"},
		"lock.embedded.data-dir":                    {"LOCKD_EMBEDDED_DATA_DIR", "data-dir"},
		"lock.embedded.quota-bytes":                 {"LOCKD_EMBEDDED_QUOTA_BYTES", "embedded-quota-bytes"},
		"lock.embedded.compaction-retain-revisions": {"LOCKD_EMBEDDED_COMPACTION_RETAIN_REVISIONS", "embedded-compaction-retain-revisions"},
		// Limits (#ct5-limits).
		"lock.session.max-ttl":                    {"LOCKD_SESSION_MAX_TTL", "session-max-ttl"},
		"lock.server.max-sessions":                {"LOCKD_SERVER_MAX_SESSIONS", "max-sessions"},
		"lock.server.max-session-opens":           {"LOCKD_SERVER_MAX_SESSION_OPENS", "max-session-opens"},
		"lock.server.max-connections":             {"LOCKD_SERVER_MAX_CONNECTIONS", "max-connections"},
		"lock.server.max-streams":                 {"LOCKD_SERVER_MAX_STREAMS", "max-streams"},
		"lock.server.max-watches":                 {"LOCKD_SERVER_MAX_WATCHES", "max-watches"},
		"lock.server.max-waiters":                 {"LOCKD_SERVER_MAX_WAITERS", "max-waiters"},
		"lock.server.max-waiters-per-key":         {"LOCKD_SERVER_MAX_WAITERS_PER_KEY", "max-waiters-per-key"},
		"lock.server.max-locks-per-session":       {"LOCKD_SERVER_MAX_LOCKS_PER_SESSION", "max-locks-per-session"},
		"lock.server.refusal-rate":                {"LOCKD_SERVER_REFUSAL_RATE", "refusal-rate"},
		"lock.server.max-lock-delay":              {"LOCKD_SERVER_MAX_LOCK_DELAY", "max-lock-delay"},
		"lock.server.max-hold-limit":              {"LOCKD_SERVER_MAX_HOLD_LIMIT", "max-hold-limit"},
		"lock.server.conn-auth-timeout":           {"LOCKD_SERVER_CONN_AUTH_TIMEOUT", "conn-auth-timeout"},
		"lock.server.idle-timeout":                {"LOCKD_SERVER_IDLE_TIMEOUT", "idle-timeout"},
		"lock.server.http.read-header-timeout":    {"LOCKD_SERVER_HTTP_READ_HEADER_TIMEOUT", "http-read-header-timeout"},
		"lock.server.principal.max-streams":       {"LOCKD_SERVER_PRINCIPAL_MAX_STREAMS", "principal-max-streams"},
		"lock.server.principal.max-watches":       {"LOCKD_SERVER_PRINCIPAL_MAX_WATCHES", "principal-max-watches"},
		"lock.server.principal.max-sessions":      {"LOCKD_SERVER_PRINCIPAL_MAX_SESSIONS", "principal-max-sessions"},
		"lock.server.principal.max-connections":   {"LOCKD_SERVER_PRINCIPAL_MAX_CONNECTIONS", "principal-max-connections"},
		"lock.server.principal.max-waiters":       {"LOCKD_SERVER_PRINCIPAL_MAX_WAITERS", "principal-max-waiters"},
		"lock.server.principal.max-inflight":      {"LOCKD_SERVER_PRINCIPAL_MAX_INFLIGHT", "principal-max-inflight"},
		"lock.server.principal.max-session-opens": {"LOCKD_SERVER_PRINCIPAL_MAX_SESSION_OPENS", "principal-max-session-opens"},
		"lock.server.tls.cert-file":               {"LOCKD_SERVER_TLS_CERT_FILE", "tls-cert-file"},
		"lock.server.tls.key-file":                {"LOCKD_SERVER_TLS_KEY_FILE", "tls-key-file"},
		"lock.server.tls.client-ca-file":          {"LOCKD_SERVER_TLS_CLIENT_CA_FILE", "tls-client-ca-file"},
		"lock.server.tls.client-auth":             {"LOCKD_SERVER_TLS_CLIENT_AUTH", "tls-client-auth"},
		"lock.server.metrics-tls.cert-file":       {"LOCKD_SERVER_METRICS_TLS_CERT_FILE", "metrics-tls-cert-file"},
		"lock.server.metrics-tls.key-file":        {"LOCKD_SERVER_METRICS_TLS_KEY_FILE", "metrics-tls-key-file"},
		"lock.server.metrics-tls.client-ca-file":  {"LOCKD_SERVER_METRICS_TLS_CLIENT_CA_FILE", "metrics-tls-client-ca-file"},
		"lock.server.metrics-tls.client-auth":     {"LOCKD_SERVER_METRICS_TLS_CLIENT_AUTH", "metrics-tls-client-auth"},
		"lock.server.insecure-allow-remote":       {"LOCKD_SERVER_INSECURE_ALLOW_REMOTE", "insecure-allow-remote"},
		"lock.etcd.tls.ca-file":                   {"LOCKD_ETCD_TLS_CA_FILE", "etcd-tls-ca-file"},
		"lock.etcd.tls.cert-file":                 {"LOCKD_ETCD_TLS_CERT_FILE", "etcd-tls-cert-file"},
		"lock.etcd.tls.key-file":                  {"LOCKD_ETCD_TLS_KEY_FILE", "etcd-tls-key-file"},
		"lock.etcd.username":                      {"LOCKD_ETCD_USERNAME", "etcd-username"},
		"lock.etcd.password-file":                 {"LOCKD_ETCD_PASSWORD_FILE", "etcd-password-file"},
		"lock.pg.dsn-file":                        {"LOCKD_PG_DSN_FILE", "pg-dsn-file"},
		"lock.auth.policy-file":                   {"LOCKD_AUTH_POLICY_FILE", "auth-policy-file"},
		"lock.auth.tokens-file":                   {"LOCKD_AUTH_TOKENS_FILE", "auth-tokens-file"},
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		w, ok := want[k.Name]
		if !ok {
			t.Errorf("key %s is not in this test's table", k.Name)
			continue
		}
		if k.Env != w[0] || k.Flag != w[1] {
			t.Errorf("%s: env=%s flag=%s, want env=%s flag=%s", k.Name, k.Env, k.Flag, w[0], w[1])
		}
		if reserved(k.Env) {
			t.Errorf("%s: env %s is reserved", k.Name, k.Env)
		}
		// The package doc's table must list the key with both names.
		found := false
		for line := range strings.SplitSeq(string(doc), "\n") {
			f := strings.Fields(strings.TrimPrefix(line, "//"))
			if len(f) > 2 && f[0] == k.Name && f[len(f)-2] == k.Env && f[len(f)-1] == "--"+k.Flag {
				found = true
			}
		}
		if !found {
			t.Errorf("doc.go table has no row %q ... %s --%s", k.Name, k.Env, k.Flag)
		}
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		env     []string
		args    []string
		want    []string // substrings of the error
		unknown bool     // errors.Is(err, ErrUnknownKey)
	}{
		{name: "unknown file key", file: "lock:\n  sesion:\n    ttl: 15s\n",
			want: []string{`"lock.sesion.ttl"`, "file ", "unknown configuration key"}, unknown: true},
		{name: "unknown top-level file key", file: "listen: x\n", want: []string{`"listen"`}, unknown: true},
		{name: "value where a section belongs", file: "lock:\n  session: 15s\n", want: []string{`"lock.session"`}, unknown: true},
		{name: "mapping under a key", file: "lock:\n  session:\n    ttl:\n      x: 1\n", want: []string{"lock.session.ttl (file", "got a mapping"}},
		{name: "unknown env", env: []string{"LOCKD_SESION_TTL=15s"}, want: []string{`"LOCKD_SESION_TTL"`, "(env)"}, unknown: true},
		{name: "bad env duration", env: []string{"LOCKD_SESSION_TTL=15"},
			want: []string{"lock.session.ttl (env LOCKD_SESSION_TTL)", `invalid duration "15"`}},
		{name: "bad flag duration", args: []string{"--session-ttl", "soon"},
			want: []string{"lock.session.ttl (flag --session-ttl)", `invalid duration "soon"`}},
		{name: "bad file duration", file: "lock:\n  etcd:\n    dial-timeout: 5\n",
			want: []string{"lock.etcd.dial-timeout (file ", `invalid duration "5"`}},
		{name: "bad bool", env: []string{"LOCKD_SERVER_CLOSE_SESSIONS_ON_SHUTDOWN=yes please"},
			want: []string{"lock.server.close-sessions-on-shutdown (env"}},
		{name: "number for a string", file: "lock:\n  pg:\n    schema: 42\n", want: []string{"lock.pg.schema (file", "want a string"}},
		{name: "units for an integer", env: []string{"LOCKD_EMBEDDED_QUOTA_BYTES=64MiB"},
			want: []string{"lock.embedded.quota-bytes (env LOCKD_EMBEDDED_QUOTA_BYTES)", `invalid integer "64MiB"`}},
		{name: "string for a file integer", file: "lock:\n  embedded:\n    quota-bytes: [1]\n",
			want: []string{"lock.embedded.quota-bytes (file", "want an integer"}},
		{name: "quota below bounds", args: []string{"--embedded-quota-bytes=1024"},
			want: []string{"lock.embedded.quota-bytes (flag --embedded-quota-bytes)", "out of bounds"}},
		{name: "map for a list", file: "lock:\n  etcd:\n    endpoints: {a: b}\n", want: []string{"lock.etcd.endpoints (file", "list of strings"}},
		{name: "ttl below bounds", env: []string{"LOCKD_SESSION_TTL=1s"}, want: []string{"lock.session.ttl (env LOCKD_SESSION_TTL)", "out of bounds"}},
		{name: "ttl above bounds", args: []string{"--session-ttl=2h"}, want: []string{"lock.session.ttl (flag --session-ttl)"}},
		{name: "margin vs ttl", file: "lock:\n  client:\n    safety-margin: 8s\n",
			want: []string{"lock.client.safety-margin (file", "< lock.session.ttl/2"}},
		{name: "bad backend", args: []string{"--backend", "zk"}, want: []string{"lock.backend (flag --backend)", `"zk"`}},
		{name: "etcd without endpoints", args: []string{"--backend", "etcd"}, want: []string{"lock.etcd.endpoints (default)"}},
		{name: "pg without dsn", env: []string{"LOCKD_BACKEND=pg"}, want: []string{"lock.pg.dsn (default)"}},
		{name: "bad schema", args: []string{"--pg-schema", "Bad-Name"}, want: []string{"lock.pg.schema (flag --pg-schema)"}},
		{name: "prefix without slash", env: []string{"LOCKD_ETCD_PREFIX=/x"}, want: []string{"lock.etcd.prefix (env LOCKD_ETCD_PREFIX)"}},
		{name: "dup dotted and nested", file: "lock.session.ttl: 10s\nlock:\n  session:\n    ttl: 20s\n",
			want: []string{"lock.session.ttl (file", "set more than once"}},
		{name: "several problems at once", file: "lock:\n  bogus: 1\n", env: []string{"LOCKD_NOPE=1", "LOCKD_SESSION_TTL=x"},
			want: []string{`"lock.bogus"`, `"LOCKD_NOPE"`, "lock.session.ttl (env"}, unknown: true},
		{name: "not a mapping", file: "- a\n- b\n", want: []string{"file ", "not valid YAML"}},
		// Transport security (C5 #ct5-tls).
		{name: "remote listen without tls", args: []string{"--listen", "0.0.0.0:7420"},
			want: []string{"lock.server.listen (flag --listen)", "set lock.server.tls.cert-file", "lock.server.insecure-allow-remote"}},
		{name: "remote metrics without tls", env: []string{"LOCKD_SERVER_METRICS_LISTEN=:7421"},
			want: []string{"lock.server.metrics-listen (env LOCKD_SERVER_METRICS_LISTEN)", "set lock.server.metrics-tls.cert-file"}},
		{name: "console without http", args: []string{"--http-console"},
			want: []string{"lock.server.http.console", "lock.server.http.listen"}},
		// Per-template statistics (C5 #ct5-stats): the C4 bound is refused at load.
		{name: "too many stats templates", env: []string{"LOCKD_SERVER_STATS_TEMPLATES=" + strings.Repeat("t/*,", 32) + "u/*"},
			want: []string{"lock.server.stats.templates", "33 templates; at most 32", "1353 series"}},
		{name: "bad stats template", args: []string{"--stats-templates", "jobs/*,job*/x"},
			want: []string{"lock.server.stats.templates (flag --stats-templates)", `segment "job*"`}},
		{name: "remote http without tls", args: []string{"--http-listen", "0.0.0.0:7422"},
			want: []string{"lock.server.http.listen (flag --http-listen)", "set lock.server.tls.cert-file", "lock.server.insecure-allow-remote"}},
		{name: "host name counts as remote", args: []string{"--listen", "lockd.example:7420"}, want: []string{"lock.server.tls.cert-file"}},
		{name: "cert without key", args: []string{"--tls-cert-file", "/c.pem"}, want: []string{"lock.server.tls.cert-file (flag", "set together"}},
		{name: "bad client auth", args: []string{"--tls-cert-file=/c", "--tls-key-file=/k", "--tls-client-auth=maybe"},
			want: []string{"lock.server.tls.client-auth (flag", `"maybe"`}},
		{name: "require without ca", args: []string{"--tls-cert-file=/c", "--tls-key-file=/k", "--tls-client-auth=require"},
			want: []string{"lock.server.tls.client-auth", "needs lock.server.tls.client-ca-file"}},
		{name: "client ca without tls", args: []string{"--tls-client-ca-file=/ca"}, want: []string{"lock.server.tls.client-ca-file (flag"}},
		{name: "etcd tls with embedded", args: []string{"--etcd-tls-ca-file=/ca"}, want: []string{"lock.etcd.tls.ca-file (flag", "lock.backend=etcd"}},
		{name: "etcd tls with http endpoint", args: []string{"--backend=etcd", "--etcd-endpoints=http://e:1", "--etcd-tls-ca-file=/ca"},
			want: []string{"lock.etcd.endpoints (flag", "https://"}},
		{name: "etcd username without password", args: []string{"--backend=etcd", "--etcd-endpoints=e:1", "--etcd-username=u"},
			want: []string{"lock.etcd.username (flag", "lock.etcd.password-file"}},
		{name: "dsn and dsn file", env: []string{"LOCKD_PG_DSN=postgres://h/db", "LOCKD_PG_DSN_FILE=/dsn"}, want: []string{"lock.pg.dsn-file (env", "not both"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadArgs(t, tt.file, tt.env, tt.args...)
			if err == nil {
				t.Fatalf("Load succeeded, want an error containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load error %q does not contain %q", err, w)
				}
			}
			if got := errors.Is(err, ErrUnknownKey); got != tt.unknown {
				t.Errorf("errors.Is(%q, ErrUnknownKey) = %v, want %v", err, got, tt.unknown)
			}
		})
	}
}

func TestAccepted(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		env   []string
		args  []string
		check func(Config) bool
	}{
		{name: "reserved env ignored",
			env:   []string{"LOCKD_SERVER=h:1", "LOCKD_KEY=k", "LOCKD_FENCING_TOKEN=7", "LOCKD_OWNER=web-3", "LOCKD_KEY_COUNT=2", "LOCKD_KEY_1=a", "LOCKD_FENCING_TOKEN_1=7", "LOCKD_FENCING_TOKENS=7 8", "LOCKD_TEST_PG_DSN=x", "PATH=/bin", "LOCKDX=1"},
			check: func(c Config) bool { return reflect.DeepEqual(c, DefaultConfig()) }},
		{name: "null and empty sections", file: "lock:\n  session:\n  etcd: {}\n  pg:\n    dsn:\n",
			check: func(c Config) bool { return reflect.DeepEqual(c, DefaultConfig()) }},
		{name: "empty file", file: "# nothing\n",
			check: func(c Config) bool { return reflect.DeepEqual(c, DefaultConfig()) }},
		{name: "list flag repeated", args: []string{"--backend=etcd", "--etcd-endpoints", "a:1", "--etcd-endpoints", "b:2,c:3"},
			check: func(c Config) bool { return reflect.DeepEqual(c.Backend.EtcdEndpoints, []string{"a:1", "b:2", "c:3"}) }},
		{name: "list as comma string in yaml", file: "lock:\n  etcd:\n    endpoints: a:1,b:2\n",
			check: func(c Config) bool { return reflect.DeepEqual(c.Backend.EtcdEndpoints, []string{"a:1", "b:2"}) }},
		{name: "bare bool flag", args: []string{"--close-sessions-on-shutdown"},
			check: func(c Config) bool { return c.Server.CloseSessionsOnShutdown }},
		{name: "bool flag false over env true", env: []string{"LOCKD_SERVER_CLOSE_SESSIONS_ON_SHUTDOWN=true"},
			args:  []string{"--close-sessions-on-shutdown=false"},
			check: func(c Config) bool { return !c.Server.CloseSessionsOnShutdown }},
		{name: "zero heartbeat as bare 0", file: "lock:\n  client:\n    heartbeat-interval: 0\n",
			check: func(c Config) bool { return c.Server.HeartbeatInterval == 0 }},
		{name: "remote listen with tls", args: []string{"--listen=0.0.0.0:7420", "--tls-cert-file=/c", "--tls-key-file=/k"},
			check: func(c Config) bool { return c.Server.GRPCTLS().Enabled() }},
		{name: "remote http with the grpc tls", args: []string{"--http-listen=0.0.0.0:7422", "--tls-cert-file=/c", "--tls-key-file=/k"},
			check: func(c Config) bool { return c.Server.HTTPListen == "0.0.0.0:7422" }},
		{name: "remote listen allowed insecure", args: []string{"--listen=:7420", "--metrics-listen=[::]:7421", "--insecure-allow-remote"},
			check: func(c Config) bool { return c.Server.InsecureAllowRemote }},
		{name: "localhost and ipv6 loopback are local", args: []string{"--listen=localhost:7420", "--metrics-listen=[::1]:7421"},
			check: func(c Config) bool { return c.Server.Listen == "localhost:7420" }},
		{name: "client tls env reserved", env: []string{"LOCKD_TLS_CA=/ca", "LOCKD_TLS_CERT=/c", "LOCKD_TLS_KEY=/k", "LOCKD_TLS_SERVER_NAME=x"},
			check: func(c Config) bool { return reflect.DeepEqual(c, DefaultConfig()) }},
		{name: "client token file env reserved", env: []string{"LOCKD_TOKEN_FILE=/t"},
			check: func(c Config) bool { return reflect.DeepEqual(c, DefaultConfig()) }},
		{name: "file list replaced by env", file: "lock:\n  backend: etcd\n  etcd:\n    endpoints: [a:1, b:2]\n",
			env:   []string{"LOCKD_ETCD_ENDPOINTS=c:3"},
			check: func(c Config) bool { return reflect.DeepEqual(c.Backend.EtcdEndpoints, []string{"c:3"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadArgs(t, tt.file, tt.env, tt.args...)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !tt.check(cfg) {
				t.Errorf("Load = %+v: check failed", cfg)
			}
		})
	}
}

func TestMissingConfigFile(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if err := fs.Parse([]string{"--config", missing}); err != nil {
		t.Fatal(err)
	}
	_, err := Load(fs, func() []string { return nil })
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("Load with a missing --config file: %v, want a not-exist error naming the file", err)
	}
}

func TestFlagHelpShowsDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	usage := fs.FlagUsages()
	for _, w := range []string{"--session-ttl duration", "(default 15s)", "LOCKD_SESSION_TTL", "--etcd-endpoints strings", "(default \"127.0.0.1:7420\")"} {
		if !strings.Contains(usage, w) {
			t.Errorf("flag usage lacks %q:\n%s", w, usage)
		}
	}
}

// TestLimitKeys: integer limit keys reject what is not a number or out of
// bounds, naming the key and source; the cross-key bounds hold.
func TestLimitKeys(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string // substring of the error
	}{
		{"not a number", []string{"LOCKD_SERVER_MAX_SESSIONS=many"}, `lock.server.max-sessions (env LOCKD_SERVER_MAX_SESSIONS): invalid integer "many"`},
		{"zero", []string{"LOCKD_SERVER_MAX_SESSIONS=0"}, "lock.server.max-sessions (env LOCKD_SERVER_MAX_SESSIONS): 0 out of bounds [1, 1000000]"},
		{"too large", []string{"LOCKD_SERVER_MAX_CONNECTIONS=1000001"}, "lock.server.max-connections (env LOCKD_SERVER_MAX_CONNECTIONS): 1000001 out of bounds"},
		{"watches above streams", []string{"LOCKD_SERVER_MAX_STREAMS=10", "LOCKD_SERVER_MAX_WATCHES=11"}, "lock.server.max-watches (env LOCKD_SERVER_MAX_WATCHES): 11 must not exceed lock.server.max-streams (10)"},
		{"per key above total", []string{"LOCKD_SERVER_MAX_WAITERS=5", "LOCKD_SERVER_MAX_WAITERS_PER_KEY=6"}, "lock.server.max-waiters-per-key (env LOCKD_SERVER_MAX_WAITERS_PER_KEY): 6 must not exceed lock.server.max-waiters (5)"},
		{"max ttl below ttl", []string{"LOCKD_SESSION_MAX_TTL=10s"}, "lock.session.max-ttl (env LOCKD_SESSION_MAX_TTL): 10s must be whole milliseconds in [lock.session.ttl (15s), 1h0m0s]"},
		{"max ttl above 1h", []string{"LOCKD_SESSION_MAX_TTL=2h"}, "lock.session.max-ttl (env LOCKD_SESSION_MAX_TTL): 2h0m0s must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadArgs(t, "", tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load(%q) = %v, want an error containing %q", tt.env, err, tt.want)
			}
		})
	}
	if _, err := loadArgs(t, "lock: {server: {max-sessions: 1.5}}\n", nil); err == nil || !strings.Contains(err.Error(), "lock.server.max-sessions") {
		t.Errorf("Load(max-sessions: 1.5) = %v, want an error naming lock.server.max-sessions", err)
	}
}
