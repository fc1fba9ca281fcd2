package server

import (
	"errors"
	"fmt"
	"log/slog"

	"lock.dev/lockd/internal/telemetry"
)

// checkAnonymousAdmin applies C5 #ct5-unsafe (issue 23 F5): a gRPC or
// HTTP/JSON listener off loopback, with TLS but neither a client CA nor a
// policy file, makes every caller who can reach it the principal anonymous
// with every permission (rule no-policy), admin included. Such a start is
// refused, naming the keys to set, unless InsecureAllowRemote, which logs
// insecure_listener with reason anonymous_admin for each such listener. A
// plaintext listener off loopback is the loopback rule's (#ct5-tls).
func (c Config) checkAnonymousAdmin(policy bool, logger *slog.Logger) error {
	if policy || c.TLSClientCAFile != "" || !c.GRPCTLS().Enabled() {
		return nil
	}
	var errs []error
	for _, l := range []struct{ name, key, addr string }{
		{telemetry.ListenerGRPC, "lock.server.listen", c.Listen},
		{telemetry.ListenerHTTP, "lock.server.http.listen", c.HTTPListen},
	} {
		if l.addr == "" || IsLoopback(l.addr) {
			continue
		}
		if c.InsecureAllowRemote {
			telemetry.InsecureListener(logger, l.name, l.addr, telemetry.InsecureAnonymousAdmin)
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %q is not a loopback address, and with TLS but neither a client CA nor an "+
			"access policy every caller would be an anonymous admin: set lock.server.tls.client-ca-file (mTLS identities), "+
			"lock.auth.policy-file (access rules), or both (or lock.server.insecure-allow-remote=true to serve so anyway; "+
			"C5 #ct5-unsafe)", l.key, l.addr))
	}
	return errors.Join(errs...)
}
