package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/server"
)

// Environment of lockd serve (C5) that lockd health reads to find the
// local server's /healthz when no --url is given.
const (
	envMetricsListen      = "LOCKD_SERVER_METRICS_LISTEN"
	envMetricsTLSCertFile = "LOCKD_SERVER_METRICS_TLS_CERT_FILE"
)

// localHealth returns the URL of the /healthz of a lockd serve started with
// the same environment on this host, and the certificate file it serves
// metrics with ("" for plaintext). An unspecified listen host (0.0.0.0, ::,
// empty) is reached over loopback.
func localHealth(e *env) (url, certFile string, err error) {
	listen := e.getenv(envMetricsListen)
	if listen == "" {
		listen = server.DefaultConfig().MetricsListen
	}
	if listen == server.MetricsOff {
		return "", "", usageErrorf("$%s is off: no /healthz to check; pass --url", envMetricsListen)
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", "", usageErrorf("$%s: %v", envMetricsListen, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	certFile = e.getenv(envMetricsTLSCertFile)
	scheme := "http"
	if certFile != "" {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/healthz", certFile, nil
}

// pinTo makes tc accept exactly the first certificate of certFile (the
// one the local server serves), whatever names it carries.
func pinTo(tc *tls.Config, certFile string) error {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return fmt.Errorf("$%s: %w", envMetricsTLSCertFile, err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return fmt.Errorf("$%s %s: no PEM certificate", envMetricsTLSCertFile, certFile)
	}
	tc.InsecureSkipVerify = true // replaced by the exact comparison below
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, block.Bytes) {
			return fmt.Errorf("the server's certificate is not the one in %s", certFile)
		}
		return nil
	}
	return nil
}

// newHealthCmd is lockd health: one GET of a server's /healthz, for
// container health checks where no curl exists (deploy/container).
func newHealthCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Check a lockd server's /healthz (exit 0 when it answers 200); for container health checks",
		Long: `Health sends one GET to a lockd server's /healthz on its metrics listener and
exits 0 when the answer is 200 OK, 1 otherwise (503 while shutting down, no
answer, a TLS error). The image in deploy/container uses it as its
HEALTHCHECK, since the image has no curl.

Without --url it checks the local server started with the same environment:
the address of $LOCKD_SERVER_METRICS_LISTEN (default 127.0.0.1:7421; an
unspecified host such as 0.0.0.0 is reached over loopback), over https when
$LOCKD_SERVER_METRICS_TLS_CERT_FILE is set, accepting exactly the certificate
in that file. (A metrics listener that requires client certificates cannot
be checked this way.)

With an https --url the server's certificate is verified against --tls-ca (or
the system roots); --insecure-skip-verify skips that, as the kubelet's HTTPS
probes do: meant only for a probe of the local process over loopback.`,
		Args: exactArgs(0, "no arguments"),
	}
	url := cmd.Flags().String("url", "", "the /healthz URL, http or https (default: the local server's, from $"+envMetricsListen+")")
	timeout := cmd.Flags().Duration("timeout", 5*time.Second, "how long to wait for the answer")
	caFile := cmd.Flags().String("tls-ca", "", "PEM CA bundle to verify an https server with (default: the system roots)")
	skipVerify := cmd.Flags().Bool("insecure-skip-verify", false, "do not verify an https server's certificate (loopback probes only)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: *skipVerify}
		if *url == "" {
			u, certFile, err := localHealth(e)
			if err != nil {
				return err
			}
			*url = u
			if certFile != "" && *caFile == "" && !*skipVerify {
				if err := pinTo(tc, certFile); err != nil {
					return err
				}
			}
		}
		if *caFile != "" {
			pem, err := os.ReadFile(*caFile)
			if err != nil {
				return fmt.Errorf("--tls-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("--tls-ca %s: no PEM certificate", *caFile)
			}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: nil}}
		ctx, cancel := context.WithTimeout(cmd.Context(), *timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
		if err != nil {
			return usageErrorf("--url: %v", err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s %q", *url, resp.Status, body)
		}
		_, err = fmt.Fprintf(e.stdout, "%s: %s\n", *url, resp.Status)
		return err
	}
	return cmd
}
