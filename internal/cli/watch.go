package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

// eventJSON is the JSON form of one watch event (one object per line).
type eventJSON struct {
	Kind    string `json:"kind"`
	Key     string `json:"key"`
	Token   uint64 `json:"token,omitempty"`
	Session string `json:"session,omitempty"`
	// Owner, Labels and Value: the holder's, in acquired and value events
	// (C2 #ct2-holder); the value is base64, as in lockd inspect.
	Owner  string            `json:"owner,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Value  []byte            `json:"value,omitempty"`
}

func newWatchCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "watch [PREFIX]",
		Example: exampleWatch,
		Short:   "Print one line per lock event (acquired, released, expired, revoked, value) until interrupted",
		Long: `Watch prints one line per change to the keys starting with PREFIX (all keys
without one), in commit order, until interrupted. Once the watch is
established it says so on stderr; every change after that is printed.
Acquired and value events (a holder set its value) show the holder's owner
and value as the server read them when it sent the event.

With several --server addresses the watch moves to another replica when
its replica dies, drains or goes silent (no event and no progress message
for three of the server's heartbeat intervals), and goes on right after the
last event printed; a "resync" line says the server could not tell what
happened meanwhile (PostgreSQL, compacted etcd history): events may have
been missed.`,
		Args: maxArgs(1, "at most a PREFIX"),
	}
	cf := addClientFlags(cmd, e)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		prefix := ""
		if len(args) == 1 {
			prefix = args[0]
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()
		// Only establishing the watch is bounded by --timeout: ctx is also
		// the watch's lifetime.
		timer := time.AfterFunc(cf.timeout, cancel)
		events, err := c.Watch(ctx, prefix, client.WithHolders())
		if !timer.Stop() && cmd.Context().Err() == nil {
			return fmt.Errorf("lockd server at %s unavailable (gave up after --timeout %v): watch %q: %w",
				cf.server, cf.timeout, prefix, context.DeadlineExceeded)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "watching %q\n", prefix)
		for ev := range events {
			if ev.Err != nil && cmd.Context().Err() != nil {
				return nil // interrupted while the watch was resuming
			}
			if ev.Err != nil {
				return fmt.Errorf("watch broke (events may have been missed): %w", ev.Err)
			}
			if out.json() {
				err = writeJSON(e.stdout, eventJSON{Kind: ev.Kind.String(), Key: ev.Key, Token: ev.Token, Session: ev.Session,
					Owner: ev.Owner, Labels: ev.Labels, Value: ev.Value})
			} else {
				line := fmt.Sprintf("%-8s %s token=%d session=%s", ev.Kind, displayKey(ev.Key), ev.Token, ev.Session)
				if ev.Owner != "" {
					line += fmt.Sprintf(" owner=%q", ev.Owner)
				}
				if len(ev.Value) > 0 {
					line += fmt.Sprintf(" value=%q", ev.Value)
				}
				_, err = fmt.Fprintln(e.stdout, line)
			}
			if err != nil {
				return err
			}
		}
		return nil // ctx ended: interrupted
	}
	return cmd
}
