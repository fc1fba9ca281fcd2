package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

// ExitStale is lockd check's exit code for a token that is not current.
const ExitStale = 3

const exampleCheck = `  lockd check jobs/backup 1764929812345678
  lockd check --cached -o json jobs/backup 1764929812345678`

func newCheckCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "check KEY TOKEN",
		Example: exampleCheck,
		Short:   "Say whether TOKEN is a current grant of KEY (exit 0 current, 3 stale)",
		Long: "Check asks the server whether the fencing token TOKEN is a current grant of KEY (C2\n" +
			"#ct2-check-token; Chubby's CheckSequencer): exit status 0 when it is, 3 when it is not (a newer\n" +
			"grant, or nobody holds KEY), 1 on an error. It needs read access to KEY. By default the server\n" +
			"reads the backend (linearizable); --cached answers from the server's watch-fed index, without a\n" +
			"backend read, at most one watch delivery delay behind.",
		Args: exactArgs(2, "KEY TOKEN"),
	}
	cf := addClientFlags(cmd, e)
	out := addOutputFlag(cmd)
	cached := cmd.Flags().Bool("cached", false, "answer from the server's index (cheaper, at most one watch delay behind)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		token, perr := strconv.ParseUint(args[1], 10, 64)
		if perr != nil || token == 0 {
			return usageErrorf("TOKEN %q: want a fencing token (a positive decimal integer)", args[1])
		}
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		var res client.TokenCheck
		err = cf.call(cmd.Context(), func(ctx context.Context) error {
			res, err = c.CheckToken(ctx, args[0], token, client.CheckOptions{Cached: *cached})
			return err
		})
		if err != nil {
			return err
		}
		if out.json() {
			tokens := make([]string, 0, len(res.Tokens))
			for _, t := range res.Tokens {
				tokens = append(tokens, strconv.FormatUint(t, 10))
			}
			err = writeJSON(e.stdout, map[string]any{"key": args[0], "token": strconv.FormatUint(token, 10),
				"current": res.Current, "tokens": tokens, "cached": res.Cached})
		} else {
			switch {
			case res.Current:
				_, err = fmt.Fprintf(e.stdout, "current: %s token %d\n", displayKey(args[0]), token)
			case len(res.Tokens) == 0:
				_, err = fmt.Fprintf(e.stdout, "stale: %s is not held\n", displayKey(args[0]))
			default:
				_, err = fmt.Fprintf(e.stdout, "stale: %s is held with token %s\n", displayKey(args[0]), joinTokens(res.Tokens))
			}
		}
		if err != nil {
			return err
		}
		if !res.Current {
			return &exitError{code: ExitStale}
		}
		return nil
	}
	return cmd
}

func joinTokens(ts []uint64) string {
	s := ""
	for i, t := range ts {
		if i > 0 {
			s += ", "
		}
		s += strconv.FormatUint(t, 10)
	}
	return s
}
