package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

func newInspectCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Describe a key: holder, fencing token, how long it has been held, waiters",
		Args:  exactArgs(1, "KEY"),
	}
	cf := addClientFlags(cmd, e)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		var info client.LockInfo
		err = cf.call(cmd.Context(), func(ctx context.Context) error {
			info, err = c.Inspect(ctx, args[0])
			return err
		})
		if err != nil {
			return err
		}
		now := time.Now()
		if out.json() {
			return writeJSON(e.stdout, toJSON(info, now))
		}
		var b strings.Builder
		fmt.Fprintf(&b, "key:       %s\n", displayKey(info.Key))
		if !info.Held {
			fmt.Fprintf(&b, "held:      no\n")
			if info.DelayRemaining > 0 {
				fmt.Fprintf(&b, "delay:     %v left (lock-delay after an involuntary end: nobody is granted the key before)\n", info.DelayRemaining)
			}
		} else {
			fmt.Fprintf(&b, "held:      yes\n")
			fmt.Fprintf(&b, "token:     %d\n", info.Token)
			fmt.Fprintf(&b, "session:   %s\n", info.Session)
			fmt.Fprintf(&b, "holder:    %s\n", heldBy(info, now))
			if info.Owner != "" {
				fmt.Fprintf(&b, "owner:     %s\n", displayKey(info.Owner))
			}
			if len(info.Labels) > 0 {
				fmt.Fprintf(&b, "labels:    %s\n", displayLabels(info.Labels))
			}
			if len(info.Value) > 0 {
				fmt.Fprintf(&b, "value:     %s\n", displayValue(info.Value))
			}
			fmt.Fprintf(&b, "held for:  %s (since %s)\n", formatHeld(heldFor(info, now)), info.AcquiredAt.UTC().Format(time.RFC3339Nano))
			if info.LockDelay > 0 {
				fmt.Fprintf(&b, "delay:     %v after an involuntary end\n", info.LockDelay)
			}
		}
		fmt.Fprintf(&b, "waiters:   %d\n", len(info.Waiters))
		for i, w := range info.Waiters {
			fmt.Fprintf(&b, "  %d. %s\n", i+1, w)
		}
		_, err = fmt.Fprint(e.stdout, b.String())
		return err
	}
	return cmd
}
