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
		Use:     "inspect KEY",
		Example: exampleInspect,
		Short:   "Describe a key: holder, fencing token, how long it has been held, waiters",
		Long: "Describe a key: holder, fencing token, how long it has been held, waiters. For a semaphore or\n" +
			"read/write key, its kind and every holder in token order (token, mode, session, owner, labels,\n" +
			"value, held for). Keys, owners, labels and values that are not plain printable text are shown\n" +
			"Go-quoted. -o json lists every holder under \"holders\".",
		Args: exactArgs(1, "KEY"),
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
		} else if kind := multiKind(info); kind != "" {
			writeHolders(&b, info, kind, now)
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
			for _, e := range info.WaitEstimates { // C2 #ct2-wait-estimate: none when the server has none
				if e.Session == w {
					fmt.Fprintf(&b, "     estimated wait %.1fs (not a promise)\n", e.Wait.Seconds())
				}
			}
		}
		_, err = fmt.Fprint(e.stdout, b.String())
		return err
	}
	return cmd
}

// writeHolders writes the text form of a semaphore or read/write key's
// holders: its kind, then one entry per holder in token order (token, mode,
// session, owner, labels, value, held for), each shown like a key.
func writeHolders(b *strings.Builder, info client.LockInfo, kind string, now time.Time) {
	fmt.Fprintf(b, "held:      yes\n")
	if kind == "rw" {
		fmt.Fprintf(b, "kind:      read/write lock\n")
		fmt.Fprintf(b, "holders:   %d\n", len(info.Holders))
	} else {
		fmt.Fprintf(b, "kind:      semaphore of %d\n", info.Limit)
		fmt.Fprintf(b, "holders:   %d of %d\n", len(info.Holders), info.Limit)
	}
	for i, h := range info.Holders {
		mode := ""
		if h.Mode != "" {
			mode = " " + h.Mode
		}
		fmt.Fprintf(b, "  %d. token %d%s, session %s", i+1, h.Token, mode, h.Session)
		if h.Owner != "" {
			fmt.Fprintf(b, ", owner %s", displayKey(h.Owner))
		}
		fmt.Fprintf(b, ", held for %s", formatHeld(holderHeldFor(h, now)))
		if !h.AcquiredAt.IsZero() {
			fmt.Fprintf(b, " (since %s)", h.AcquiredAt.UTC().Format(time.RFC3339Nano))
		}
		b.WriteByte('\n')
		if len(h.Labels) > 0 {
			fmt.Fprintf(b, "     labels:  %s\n", displayLabels(h.Labels))
		}
		if len(h.Value) > 0 {
			fmt.Fprintf(b, "     value:   %s\n", displayValue(h.Value))
		}
	}
}
