package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// DefaultHealthURL is the /healthz of a lockd serve with the default
// lock.server.metrics-listen.
const DefaultHealthURL = "http://127.0.0.1:7421/healthz"

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

With an https URL the server's certificate is verified against --tls-ca (or
the system roots); --insecure-skip-verify skips that, as the kubelet's HTTPS
probes do: meant only for a probe of the local process over loopback.`,
		Args: exactArgs(0, "no arguments"),
	}
	url := cmd.Flags().String("url", DefaultHealthURL, "the /healthz URL (http or https)")
	timeout := cmd.Flags().Duration("timeout", 5*time.Second, "how long to wait for the answer")
	caFile := cmd.Flags().String("tls-ca", "", "PEM CA bundle to verify an https server with (default: the system roots)")
	skipVerify := cmd.Flags().Bool("insecure-skip-verify", false, "do not verify an https server's certificate (loopback probes only)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: *skipVerify}
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
