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
	return cmd
}
