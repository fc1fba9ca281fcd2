// Package config loads lockd's C5 configuration (docs/contracts/C5.md
// #ct5-config). It is the only place that reads C5: Load returns a Config
// whose parts go to their consumers, each holding only its own keys —
// Config.Server (server.Config) to server.New, Config.Backend
// (backend.Config) to backend.Open, Config.Auth (auth.Config) to auth.New.
//
// # Sources and precedence
//
// Load layers four sources, each overriding the one before:
//
//  1. the defaults of DefaultConfig (server.DefaultConfig and
//     backend.DefaultConfig);
//  2. the YAML file named by --config (none by default; lockd runs without one);
//  3. environment variables LOCKD_*;
//  4. command-line flags.
//
// The result is checked with Config.Validate (each part's Validate); the
// errors are listed in the order of the table below. Every error names the key
// it is about and, where it helps, the source that set the value, e.g.
//
//	lock.session.ttl (env LOCKD_SESSION_TTL): invalid duration "15"
//	lock.client.safety-margin (file lockd.yaml): 8s must be > 0 and < lock.session.ttl/2 (7.5s)
//	"lock.sesion.ttl" (file lockd.yaml): unknown configuration key
//
// # Keys
//
// The YAML path is the key itself, nested at each dot (lock: session: ttl: 15s;
// a dotted key such as "lock.session.ttl: 15s" at the top level is accepted
// too). The environment variable is LOCKD_ followed by the key without
// "lock.", upper-cased, with "." and "-" replaced by "_". Durations are Go
// durations (300ms, 15s, 1m30s; a bare number other than 0 is an error).
//
//	Key                                      Default         Bounds                                       Env                                      Flag
//	lock.backend                             embedded        embedded | etcd | pg                         LOCKD_BACKEND                            --backend
//	lock.session.ttl                         15s             2s..1h, whole milliseconds                   LOCKD_SESSION_TTL                        --session-ttl
//	lock.client.safety-margin                2s              > 0 and < lock.session.ttl/2                 LOCKD_CLIENT_SAFETY_MARGIN               --safety-margin
//	lock.client.heartbeat-interval           0 (= ttl/3)     0, or 100ms..ttl − 2×safety-margin           LOCKD_CLIENT_HEARTBEAT_INTERVAL          --heartbeat-interval
//	lock.server.listen                       127.0.0.1:7420  non-empty host:port                          LOCKD_SERVER_LISTEN                      --listen
//	lock.server.metrics-listen               127.0.0.1:7421  non-empty host:port, or "off"                LOCKD_SERVER_METRICS_LISTEN              --metrics-listen
//	lock.server.http.listen                  (empty: off)    host:port, or empty (HTTP/JSON API)          LOCKD_SERVER_HTTP_LISTEN                 --http-listen
//	lock.server.http.console                 false           true | false; needs http.listen (console)    LOCKD_SERVER_HTTP_CONSOLE                --http-console
//	lock.server.stats.templates              (first segment) at most 32 templates (C5 #ct5-stats)         LOCKD_SERVER_STATS_TEMPLATES             --stats-templates
//	lock.server.stats.enabled                true            true | false (C5 #ct5-stats)                 LOCKD_SERVER_STATS_ENABLED               --stats-enabled
//	lock.server.tracing.enabled              false           true | false (C5 #ct5-tracing)               LOCKD_SERVER_TRACING_ENABLED             --tracing-enabled
//	lock.server.tracing.otlp-endpoint        (OTLP default)  host:port of the collector                   LOCKD_SERVER_TRACING_OTLP_ENDPOINT       --tracing-otlp-endpoint
//	lock.server.tracing.otlp-protocol        grpc            grpc | http                                  LOCKD_SERVER_TRACING_OTLP_PROTOCOL       --tracing-otlp-protocol
//	lock.server.tracing.otlp-insecure        false           true | false (false: TLS)                    LOCKD_SERVER_TRACING_OTLP_INSECURE       --tracing-otlp-insecure
//	lock.server.tracing.otlp-ca-file         (system roots)  PEM CA bundle; not with otlp-insecure        LOCKD_SERVER_TRACING_OTLP_CA_FILE        --tracing-otlp-ca-file
//	lock.server.tracing.sample-ratio         1               0..1                                         LOCKD_SERVER_TRACING_SAMPLE_RATIO        --tracing-sample-ratio
//	lock.server.close-sessions-on-shutdown   false           true | false                                 LOCKD_SERVER_CLOSE_SESSIONS_ON_SHUTDOWN  --close-sessions-on-shutdown
//	lock.server.drain-timeout                5s              0, or 100ms..1m                              LOCKD_SERVER_DRAIN_TIMEOUT               --drain-timeout
//	lock.server.tls.cert-file                (none)          PEM certificate; with key-file               LOCKD_SERVER_TLS_CERT_FILE               --tls-cert-file
//	lock.server.tls.key-file                 (none)          PEM key of cert-file                         LOCKD_SERVER_TLS_KEY_FILE                --tls-key-file
//	lock.server.tls.client-ca-file           (none)          PEM CA bundle; needs cert-file               LOCKD_SERVER_TLS_CLIENT_CA_FILE          --tls-client-ca-file
//	lock.server.tls.client-auth              (auto)          none | request | require                     LOCKD_SERVER_TLS_CLIENT_AUTH             --tls-client-auth
//	lock.server.metrics-tls.cert-file        (none)          as lock.server.tls.cert-file                 LOCKD_SERVER_METRICS_TLS_CERT_FILE       --metrics-tls-cert-file
//	lock.server.metrics-tls.key-file         (none)          as lock.server.tls.key-file                  LOCKD_SERVER_METRICS_TLS_KEY_FILE        --metrics-tls-key-file
//	lock.server.metrics-tls.client-ca-file   (none)          as lock.server.tls.client-ca-file            LOCKD_SERVER_METRICS_TLS_CLIENT_CA_FILE  --metrics-tls-client-ca-file
//	lock.server.metrics-tls.client-auth      (auto)          none | request | require                     LOCKD_SERVER_METRICS_TLS_CLIENT_AUTH     --metrics-tls-client-auth
//	lock.server.insecure-allow-remote        false           true | false                                 LOCKD_SERVER_INSECURE_ALLOW_REMOTE       --insecure-allow-remote
//	lock.etcd.endpoints                      (none)          at least one when lock.backend=etcd          LOCKD_ETCD_ENDPOINTS                     --etcd-endpoints
//	lock.etcd.prefix                         /lockd/         non-empty, ends with /                       LOCKD_ETCD_PREFIX                        --etcd-prefix
//	lock.etcd.dial-timeout                   5s              100ms..1m                                    LOCKD_ETCD_DIAL_TIMEOUT                  --etcd-dial-timeout
//	lock.etcd.auto-sync-interval             30s             0 (off), or 1s..1h (backend etcd)            LOCKD_ETCD_AUTO_SYNC_INTERVAL            --etcd-auto-sync-interval
//	lock.etcd.tls.ca-file                    (none)          PEM CA bundle; https:// endpoints            LOCKD_ETCD_TLS_CA_FILE                   --etcd-tls-ca-file
//	lock.etcd.tls.cert-file                  (none)          PEM client certificate; with key-file        LOCKD_ETCD_TLS_CERT_FILE                 --etcd-tls-cert-file
//	lock.etcd.tls.key-file                   (none)          PEM key of cert-file                         LOCKD_ETCD_TLS_KEY_FILE                  --etcd-tls-key-file
//	lock.etcd.username                       (none)          with password-file                           LOCKD_ETCD_USERNAME                      --etcd-username
//	lock.etcd.password-file                  (none)          file with the password                       LOCKD_ETCD_PASSWORD_FILE                 --etcd-password-file
//	lock.pg.dsn                              (none)          required when lock.backend=pg                LOCKD_PG_DSN                             --pg-dsn
//	lock.pg.dsn-file                         (none)          file with the DSN; excludes lock.pg.dsn      LOCKD_PG_DSN_FILE                        --pg-dsn-file
//	lock.pg.schema                           lockd           [a-z_][a-z0-9_]*, at most 63 bytes           LOCKD_PG_SCHEMA                          --pg-schema
//	lock.pg.reaper-interval                  1s              100ms..1m                                    LOCKD_PG_REAPER_INTERVAL                 --pg-reaper-interval
//	lock.pg.max-conns                        16              0 (the DSN's pool_max_conns), or 1..1000     LOCKD_PG_MAX_CONNS                       --pg-max-conns
//	lock.embedded.data-dir                   (C5 #ct5-data-dir) non-empty when lock.backend=embedded         LOCKD_EMBEDDED_DATA_DIR                  --data-dir
//	lock.embedded.quota-bytes                2147483648      16 MiB..8 GiB, in bytes                      LOCKD_EMBEDDED_QUOTA_BYTES               --embedded-quota-bytes
//	lock.embedded.compaction-retain-revisions 10000          0 (off), or 1000..1000000000                 LOCKD_EMBEDDED_COMPACTION_RETAIN_REVISIONS --embedded-compaction-retain-revisions
//
//	Limits (#ct5-limits; exceeding one is RESOURCE_EXHAUSTED, reason LIMIT):
//	lock.session.max-ttl                     1h              lock.session.ttl..1h, whole milliseconds     LOCKD_SESSION_MAX_TTL                    --session-max-ttl
//	lock.server.max-sessions                 10000           1..1000000                                   LOCKD_SERVER_MAX_SESSIONS                --max-sessions
//	lock.server.max-session-opens            64              1..1000000                                   LOCKD_SERVER_MAX_SESSION_OPENS           --max-session-opens
//	lock.server.max-connections              1024            1..1000000                                   LOCKD_SERVER_MAX_CONNECTIONS             --max-connections
//	lock.server.max-streams                  2048            1..1000000                                   LOCKD_SERVER_MAX_STREAMS                 --max-streams
//	lock.server.max-watches                  256             1..lock.server.max-streams                   LOCKD_SERVER_MAX_WATCHES                 --max-watches
//	lock.server.max-waiters                  4096            1..1000000                                   LOCKD_SERVER_MAX_WAITERS                 --max-waiters
//	lock.server.max-waiters-per-key          256             1..lock.server.max-waiters                   LOCKD_SERVER_MAX_WAITERS_PER_KEY         --max-waiters-per-key
//	lock.server.max-locks-per-session        1024            1..1000000                                   LOCKD_SERVER_MAX_LOCKS_PER_SESSION       --max-locks-per-session
//	lock.server.refusal-rate                 10              0 (off), or 1..1000000 per second per peer   LOCKD_SERVER_REFUSAL_RATE                --refusal-rate
//	lock.server.max-lock-delay               1m              0..1h                                        LOCKD_SERVER_MAX_LOCK_DELAY              --max-lock-delay
//	lock.server.max-hold-limit               24h             0, or 1s..168h                               LOCKD_SERVER_MAX_HOLD_LIMIT              --max-hold-limit
//	lock.server.conn-auth-timeout           10s             1s..10m; no authorised call: closed           LOCKD_SERVER_CONN_AUTH_TIMEOUT           --conn-auth-timeout
//	lock.server.idle-timeout                 2m              10s..24h; no call in progress: closed        LOCKD_SERVER_IDLE_TIMEOUT                --idle-timeout
//	lock.server.http.read-header-timeout     10s             1s..1m (TLS handshake and headers)           LOCKD_SERVER_HTTP_READ_HEADER_TIMEOUT    --http-read-header-timeout
//	lock.server.principal.max-streams        0 (= 25 %)      0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_STREAMS       --principal-max-streams
//	lock.server.principal.max-watches        0 (= 25 %)      0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_WATCHES       --principal-max-watches
//	lock.server.principal.max-sessions       0 (= 25 %)      0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_SESSIONS      --principal-max-sessions
//	lock.server.principal.max-connections    0 (= 25 %)      0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_CONNECTIONS   --principal-max-connections
//	lock.server.principal.max-waiters        0 (= 25 %)      0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_WAITERS       --principal-max-waiters
//	lock.server.principal.max-inflight       0 (= 4 × conns) 0..1000000, under a policy                   LOCKD_SERVER_PRINCIPAL_MAX_INFLIGHT      --principal-max-inflight
//	lock.server.principal.max-session-opens  0 (= 25 %)      0..1000000 per second, under a policy        LOCKD_SERVER_PRINCIPAL_MAX_SESSION_OPENS --principal-max-session-opens
//
//	lock.auth.policy-file                    (none)          a YAML policy file (C5 #ct5-auth)             LOCKD_AUTH_POLICY_FILE                   --auth-policy-file
//	lock.auth.tokens-file                    (none)          a tokens file; needs lock.auth.policy-file   LOCKD_AUTH_TOKENS_FILE                   --auth-tokens-file
//
// Value syntax per source:
//
//   - lists (lock.etcd.endpoints, lock.server.stats.templates): a YAML sequence or a comma-separated
//     string in the file; a comma-separated string in the environment; a
//     comma-separated value, or the flag repeated, on the command line;
//   - booleans: a YAML boolean; true/false/1/0 in the environment; a bare
//     --close-sessions-on-shutdown (or =true/=false) on the command line;
//   - strings: a YAML string (a number is rejected: quote it);
//   - integers (lock.embedded.*-bytes, -revisions, the lock.server.max-*
//     limits): a YAML integer, or decimal digits in the environment and on
//     the command line.
//
// The transport security keys (lock.server.tls.*, lock.server.metrics-tls.*,
// lock.server.insecure-allow-remote, lock.etcd.tls.*, lock.etcd.username,
// lock.etcd.password-file, lock.pg.dsn-file) are described in C5
// #ct5-tls: a listener on a non-loopback address needs its TLS keys, and
// secrets come from files, never from flags.
//
// # Unknown names
//
// A key in the file that is not in the table above, and a LOCKD_* variable
// that maps to no key, are startup errors: a typo never silently falls back to
// a default. A YAML null (an empty "lock:" section, or "ttl:" with no value)
// counts as unset. An empty LOCKD_* variable counts as unset too. These LOCKD_*
// variables are not configuration and Load ignores them: LOCKD_SERVER (the
// address client commands dial), LOCKD_TLS_CA, LOCKD_TLS_CERT, LOCKD_TLS_KEY
// and LOCKD_TLS_SERVER_NAME (the client commands' TLS), LOCKD_TOKEN_FILE (their
// bearer token), LOCKD_KEY, LOCKD_FENCING_TOKEN, LOCKD_OWNER,
// LOCKD_KEY_COUNT, LOCKD_FENCING_TOKENS and every LOCKD_KEY_<n> and
// LOCKD_FENCING_TOKEN_<n> (set by `lockd run` for its child), and every LOCKD_TEST_* variable (test
// harnesses).
package config
