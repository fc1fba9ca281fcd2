package client_test

import (
	"errors"
	"strings"
	"testing"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestNewRefusesRemotePlaintext(t *testing.T) {
	for _, target := range []string{"10.1.2.3:7420", "lockd.example:7420", "dns:///lockd.example:7420",
		"0.0.0.0:7420", "custom:///anything"} {
		c, err := client.New(target)
		if err == nil {
			c.Close()
			t.Errorf("client.New(%q) without TLS succeeded, want an error", target)
			continue
		}
		if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithInsecure") {
			t.Errorf("client.New(%q) = %v, want ErrInvalidArgument naming WithTLS and WithInsecure", target, err)
		}
	}
	for _, target := range []string{"127.0.0.1:7420", "localhost:7420", "[::1]:7420", "dns:///localhost:7420",
		"passthrough:///127.0.0.2:1", "unix:///tmp/lockd.sock"} {
		c, err := client.New(target)
		if err != nil {
			t.Errorf("client.New(%q) (loopback, plaintext) = %v, want success", target, err)
			continue
		}
		c.Close()
	}
	ca := testkit.NewCA(t, "ca")
	caFile := ca.WriteCA(t, t.TempDir(), "ca.pem")
	for name, opts := range map[string][]client.Option{
		"WithInsecure": {client.WithInsecure()},
		"WithTLS":      {client.WithTLS(nil)},
		"WithTLSFiles": {client.WithTLSFiles(caFile, "", "")},
	} {
		c, err := client.New("10.1.2.3:7420", opts...)
		if err != nil {
			t.Errorf("client.New(remote, %s) = %v, want success", name, err)
			continue
		}
		c.Close()
	}
	if _, err := client.New("10.1.2.3:7420", client.WithInsecure(), client.WithTLS(nil)); err == nil {
		t.Error("client.New with both WithInsecure and WithTLS succeeded, want an error")
	}
	if _, err := client.New("10.1.2.3:7420", client.WithTLSFiles("/nonexistent/ca.pem", "", "")); err == nil {
		t.Error("client.New with a missing CA file succeeded, want an error")
	}
}
