package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// ErrUnauthenticated is a call whose credentials are refused: an unknown
// bearer token, a token while no tokens file is configured, a malformed
// authorization header, or a certificate and a token naming different
// principals (C2 #ct2-wire-auth UNAUTHENTICATED).
var ErrUnauthenticated = errors.New("auth: unauthenticated")

// AuthorizationHeader is the gRPC metadata key of a bearer token.
const AuthorizationHeader = "authorization"

// CertificatePrincipal is the principal a verified client certificate
// stands for: its first URI SAN (SPIFFE-style), else its Subject CN; ""
// when it has neither.
func CertificatePrincipal(cert *x509.Certificate) string {
	if cert == nil {
		return ""
	}
	for _, u := range cert.URIs {
		if s := u.String(); s != "" {
			return s
		}
	}
	return cert.Subject.CommonName
}

// PeerCertificate returns the verified client certificate of the gRPC call
// in ctx (the leaf of its first verified chain), or nil when the connection
// is plaintext or the client sent no certificate that verified.
func PeerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// bearerToken returns the bearer token of the call in ctx, "" when it sent
// none. More than one authorization value, or another scheme, is
// ErrUnauthenticated.
func bearerToken(ctx context.Context) (string, error) {
	// Only this key's values: FromIncomingContext would copy every header
	// of the call (issue 24: 4 % of the server's allocations per call).
	vals := metadata.ValueFromIncomingContext(ctx, AuthorizationHeader)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", errors.New("auth: more than one authorization header")
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errors.New("auth: the authorization header is not \"Bearer <token>\"")
	}
	return token, nil
}

// identify resolves the principal of the call in ctx (C5 #ct5-auth) with the
// tokens tok. A refused credential is ErrUnauthenticated; the principal is
// then the one the certificate names, if any, for the audit trail.
func identify(ctx context.Context, tok *Tokens) (string, error) {
	certP := CertificatePrincipal(PeerCertificate(ctx))
	token, err := bearerToken(ctx)
	if err != nil {
		return orAnonymous(certP), errors.Join(ErrUnauthenticated, err)
	}
	if token == "" {
		return orAnonymous(certP), nil
	}
	tokP, ok := tok.Lookup(token)
	switch {
	case !ok:
		return orAnonymous(certP), errors.Join(ErrUnauthenticated, errors.New("auth: unknown bearer token"))
	case certP != "" && certP != tokP:
		return certP, errors.Join(ErrUnauthenticated, errors.New("auth: the client certificate and the bearer token name different principals"))
	}
	return tokP, nil
}

func orAnonymous(p string) string {
	if p == "" {
		return Anonymous
	}
	return p
}
