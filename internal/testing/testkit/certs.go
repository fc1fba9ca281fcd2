package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test: an ECDSA P-256 key and a
// self-signed certificate valid from an hour ago for a day.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testkit: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testkit: parse CA certificate: %v", err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// CertOptions describe a certificate to issue. The zero value is a
// certificate for both server and client use, named "localhost",
// 127.0.0.1 and ::1, valid from an hour ago for a day.
type CertOptions struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	URIs       []*url.URL
	// NotBefore and NotAfter override the validity window (set both in the
	// past for an expired certificate).
	NotBefore, NotAfter time.Time
}

// Cert is an issued certificate and its key, PEM-encoded.
type Cert struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a new certificate with ca.
func (ca *CA) Issue(t testing.TB, o CertOptions) Cert {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(24 * time.Hour)
	}
	if o.CommonName == "" {
		o.CommonName = "localhost"
	}
	if o.DNSNames == nil && o.IPs == nil && o.URIs == nil {
		o.DNSNames = []string{"localhost"}
		o.IPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
		URIs:         o.URIs,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("testkit: issue certificate: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testkit: marshal key: %v", err)
	}
	return Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
}

// Pool returns a pool holding only ca's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteCA writes ca's certificate to dir/name and returns the path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	return writeFile(t, filepath.Join(dir, name), ca.PEM)
}

// TLS returns c as a tls.Certificate.
func (c Cert) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	tc, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatalf("testkit: key pair: %v", err)
	}
	return tc
}

// Write writes c to dir/name.crt and dir/name.key (mode 0600) and returns
// their paths. Each file is written to a temporary name and renamed into
// place, so a reader never sees half a file.
func (c Cert) Write(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	keyFile = writeFile(t, filepath.Join(dir, name+".key"), c.KeyPEM)
	certFile = writeFile(t, filepath.Join(dir, name+".crt"), c.CertPEM)
	return certFile, keyFile
}

func writeFile(t testing.TB, path string, b []byte) string {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatalf("testkit: write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("testkit: rename %s: %v", tmp, err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testkit: generate key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("testkit: serial: %v", err)
	}
	return n
}
