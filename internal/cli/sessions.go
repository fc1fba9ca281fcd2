package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

// sessionJSON is one session of `lockd sessions -o json`.
type sessionJSON struct {
	Session     string            `json:"session"`
	Principal   string            `json:"principal,omitempty"`
	Owner       string            `json:"owner,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	TTLMs       int64             `json:"ttl_ms"`
	RemainingMs int64             `json:"remaining_ms"`
	Locks       int               `json:"locks"`
}

func newSessionsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List live sessions: your own, or every session with admin on every key (id, principal, owner, TTL, time left, locks)",
		Long: `Sessions lists live sessions, one line each: id, principal, owner, TTL, time
left and how many locks it holds. A caller sees the sessions bound to its own
principal; a caller with admin on every key sees every session, and
--principal narrows the list to one principal (others may name only
themselves). Time left is a lower bound read by the server; listing extends
nothing. Session secrets are never shown. -o json prints them as one JSON
array.`,
		Example: exampleSessions,
		Args:    maxArgs(0, "no arguments"),
	}
	cf := addClientFlags(cmd, e)
	out := addOutputFlag(cmd)
	principal := cmd.Flags().String("principal", "", "only the sessions bound to this principal")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.check(); err != nil {
			return err
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		var all []client.SessionInfo
		for page := ""; ; {
			var infos []client.SessionInfo
			err := cf.call(cmd.Context(), func(ctx context.Context) error {
				infos, page, err = c.ListSessions(ctx, client.ListSessionsOptions{Principal: *principal, PageToken: page})
				return err
			})
			if err != nil {
				return err
			}
			all = append(all, infos...)
			if page == "" {
				break
			}
		}
		if out.json() {
			js := make([]sessionJSON, 0, len(all))
			for _, s := range all {
				js = append(js, sessionJSON{Session: s.ID, Principal: s.Principal, Owner: s.Owner, Labels: s.Labels,
					TTLMs: s.TTL.Milliseconds(), RemainingMs: s.Remaining.Milliseconds(), Locks: s.Locks})
			}
			return writeJSON(e.stdout, js)
		}
		dash := func(s string) string {
			if s == "" {
				return "-"
			}
			return displayKey(s)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SESSION\tPRINCIPAL\tOWNER\tTTL\tLEFT\tLOCKS")
		for _, s := range all {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", displayKey(s.ID), dash(s.Principal), dash(s.Owner), s.TTL, s.Remaining, s.Locks)
		}
		return tw.Flush()
	}
	cmd.AddCommand(newSessionsCloseCmd(e))
	return cmd
}

func newSessionsCloseCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "close --principal P",
		Short: "Close every session of a principal (admin on every key; audited)",
		Long: `Close closes every live session bound to the principal --principal names, as
each session's own close would: its locks are released and its client learns at
its next heartbeat. It needs admin on every key; each close is logged by the
server as session_closed with your principal (C4 #ct4-audit). It prints how many
sessions it closed and how many locks they released.`,
		Example: "  lockd sessions close --principal mallory",
		Args:    maxArgs(0, "no arguments (name the principal with --principal)"),
	}
	cf := addClientFlags(cmd, e)
	principal := cmd.Flags().String("principal", "", "the principal whose sessions to close (required)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *principal == "" {
			return usageErrorf("--principal is required")
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		var closed, released int
		err = cf.call(cmd.Context(), func(ctx context.Context) error {
			closed, released, err = c.CloseSessions(ctx, *principal)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "closed %d sessions of %s, %d locks released\n", closed, displayKey(*principal), released)
		return nil
	}
	return cmd
}
