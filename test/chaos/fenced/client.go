package fenced

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"lock.dev/lockd/test/chaos/history"
)

// Sentinel errors of Client.Write.
var (
	// ErrStale: the server refused the write because it has accepted a
	// higher token for the key. The write certainly did not happen.
	ErrStale = errors.New("fenced: stale token")
	// ErrBadRequest: the server refused the request as malformed. The write
	// certainly did not happen.
	ErrBadRequest = errors.New("fenced: bad request")
)

// Client writes to a Server. It is safe for concurrent use.
type Client struct {
	base string
	tr   *http.Transport
	hc   *http.Client
}

// NewClient returns a client of the server at baseURL (Server.URL). The
// client owns its connection pool; Close releases it.
func NewClient(baseURL string) *Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}
	return &Client{base: baseURL, tr: tr, hc: &http.Client{Transport: tr}}
}

// Write asks the server to accept a write for key by writer with token. It
// returns the acceptance sequence number; an error matching ErrStale or
// ErrBadRequest if the server refused it; or another error (transport,
// ctx) after which the write may or may not have happened (OutcomeOf).
func (c *Client) Write(ctx context.Context, key, writer string, token uint64) (uint64, error) {
	return c.WriteMode(ctx, key, writer, ModePlain, token)
}

// WriteMode is Write for a grant of mode (ModePlain, ModeExclusive,
// ModeShared, ModeSlot): the server applies that mode's rule (package doc,
// Modes).
func (c *Client) WriteMode(ctx context.Context, key, writer, mode string, token uint64) (uint64, error) {
	body, err := json.Marshal(writeRequest{Key: key, Writer: writer, Token: token, Mode: mode})
	if err != nil {
		return 0, fmt.Errorf("fenced: write: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/write", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("fenced: write: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("fenced: write: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusConflict:
		var rep writeReply
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			return 0, fmt.Errorf("fenced: write: decode reply: %w", err)
		}
		if resp.StatusCode == http.StatusConflict {
			return 0, fmt.Errorf("fenced: write %q token %d (highest %d): %w", key, token, rep.Highest, ErrStale)
		}
		return rep.Seq, nil
	case http.StatusBadRequest:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("fenced: write: %s: %w", bytes.TrimSpace(msg), ErrBadRequest)
	default:
		return 0, fmt.Errorf("fenced: write: unexpected status %s", resp.Status)
	}
}

// Writes fetches every accepted write from the server (GET /writes), for a
// harness that runs the server in another process.
func (c *Client) Writes(ctx context.Context) ([]Write, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/writes", nil)
	if err != nil {
		return nil, fmt.Errorf("fenced: writes: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fenced: writes: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fenced: writes: unexpected status %s", resp.Status)
	}
	var ws []Write
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		return nil, fmt.Errorf("fenced: writes: decode: %w", err)
	}
	return ws, nil
}

// Close releases the client's idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// OutcomeOf classifies the error of Client.Write for the history: nil is
// history.OK, a refusal (ErrStale, ErrBadRequest) is history.Fail, anything
// else is history.Unknown (the request may have reached the server).
func OutcomeOf(err error) history.Outcome {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, ErrStale), errors.Is(err, ErrBadRequest):
		return history.Fail
	default:
		return history.Unknown
	}
}
