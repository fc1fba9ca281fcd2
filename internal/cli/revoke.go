package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

func newRevokeCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "revoke KEY",
		Short: "Revoke a key's grant, whoever holds it (administrative)",
		Long: `Revoke deletes KEY's current grant whoever holds it. This deliberately
breaks the holder's trust: the holder is told on its keepalive stream (a
'lockd run' holding it terminates its command), and the fencing token is what
protects the resource in the meantime. The holder's session stays open.`,
		Args: exactArgs(1, "KEY"),
	}
	cf := addClientFlags(cmd, e)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		var info client.LockInfo
		err = cf.call(cmd.Context(), func(ctx context.Context) error {
			info, err = c.Revoke(ctx, args[0])
			return err
		})
		if err != nil {
			return err
		}
		if !info.Held {
			_, err = fmt.Fprintf(e.stdout, "%s was not held\n", displayKey(args[0]))
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "revoked %s (token %d, session %s)\n", displayKey(args[0]), info.Token, info.Session)
		return err
	}
	return cmd
}
