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
		Use:   "ls [PREFIX]",
		Short: "List held keys (all, or those starting with PREFIX): key, token, held for, waiters",
		Args:  maxArgs(1, "at most a PREFIX"),
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
		fmt.Fprintln(tw, "KEY\tTOKEN\tHELD FOR\tWAITERS\tOWNER")
		for _, info := range all {
			owner := "-"
			if info.Owner != "" {
				owner = displayKey(info.Owner)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", displayKey(info.Key), info.Token, formatHeld(heldFor(info, now)), len(info.Waiters), owner)
		}
		return tw.Flush()
	}
	return cmd
}
