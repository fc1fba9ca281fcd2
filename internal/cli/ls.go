package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

func newLsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls [PREFIX]",
		Example: exampleLs,
		Short:   "List held keys (all, or those starting with PREFIX): key, token, held for, waiters, mode, owner",
		Long: "List held keys (all, or those starting with PREFIX), in key order: key, fencing token, how long it has\n" +
			"been held, waiters, mode and owner. A semaphore or read/write key has a row per holder (token order):\n" +
			"MODE is sem/N for a slot of a semaphore of N, shared or exclusive for a read/write lock, - for a plain\n" +
			"lock. Keys and owners that are not plain printable text are shown Go-quoted. -o json lists every\n" +
			"holder under \"holders\".",
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
		var all []client.LockInfo
		for page := ""; ; {
			var infos []client.LockInfo
			err := cf.call(cmd.Context(), func(ctx context.Context) error {
				infos, page, err = c.List(ctx, prefix, client.ListOptions{PageToken: page})
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
		now := time.Now()
		if out.json() {
			js := make([]lockJSON, 0, len(all))
			for _, info := range all {
				js = append(js, toJSON(info, now))
			}
			return writeJSON(e.stdout, js)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tTOKEN\tHELD FOR\tWAITERS\tMODE\tOWNER")
		row := func(key string, token uint64, held time.Duration, waiters int, mode, owner string) {
			if owner == "" {
				owner = "-"
			} else {
				owner = displayKey(owner)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", displayKey(key), token, formatHeld(held), waiters, mode, owner)
		}
		for _, info := range all {
			kind := multiKind(info)
			if kind == "" {
				row(info.Key, info.Token, heldFor(info, now), len(info.Waiters), "-", info.Owner)
				continue
			}
			// A semaphore or read/write key: one row per holder.
			for _, h := range info.Holders {
				mode := h.Mode
				if kind == "semaphore" {
					mode = fmt.Sprintf("sem/%d", info.Limit)
				}
				row(info.Key, h.Token, holderHeldFor(h, now), len(info.Waiters), mode, h.Owner)
			}
		}
		return tw.Flush()
	}
	return cmd
}
