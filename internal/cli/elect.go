package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
	"lock.dev/lockd/store"
)

// electFlags are lockd elect's own flags besides run's machinery.
type electFlags struct {
	value string
}

func newElectCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "elect [flags] NAME -- CMD [ARGS...]",
		Example: exampleElect,
		Short:   "Run a command only while leader of an election",
		Long: `Elect campaigns in the election NAME and runs CMD once it is the leader, with
LOCKD_KEY (NAME) and LOCKD_FENCING_TOKEN (the leader's token) in its
environment. Candidates become leader in the order they started (FIFO); each
new leader's token is higher than every earlier one's. When CMD exits, lockd
elect resigns and the next candidate takes over at once.

An election is the lock named NAME (lockd inspect, ls and watch show the
leader as its holder; access rules apply as for locks). --value V is the
leader's value, which 'lockd leader NAME' shows (e.g. the address where the
leader serves).

If the leadership is lost while CMD runs (revoked, or the session could not
be kept alive), CMD's process group gets SIGTERM at once and SIGKILL after
--grace, and lockd elect exits with status 75, as lockd run does. SIGINT and
SIGTERM sent to lockd are forwarded to CMD's group.

Exit status:
  CMD's      CMD ran as leader: its exit status (128+N if CMD died of signal N)
  1          another error (message on stderr)
  2          usage error
  69         the server could not be reached (--timeout) before the session
             was open, or stopped answering while lockd elect campaigned
  75         the leadership was lost while CMD ran; CMD was terminated
  126, 127   CMD could not be executed, or was not found`,
		Args: func(_ *cobra.Command, args []string) error {
			_, _, err := splitRunArgs(args)
			return err
		},
	}
	cmd.Flags().SetInterspersed(false) // everything after NAME belongs to CMD
	rf := &runFlags{cf: addClientFlags(cmd, e)}
	ef := &electFlags{}
	cmd.Flags().StringVar(&ef.value, "value", "", "the leader's value while this candidate leads (at most 4096 bytes), shown by lockd leader")
	cmd.Flags().DurationVar(&rf.ttl, "ttl", 0, "session TTL (2s..1h); 0 uses the server's lock.session.ttl")
	cmd.Flags().DurationVar(&rf.grace, "grace", 5*time.Second, "after the leadership is lost, how long CMD has between SIGTERM and SIGKILL")
	cmd.Flags().StringVar(&rf.owner, "owner", "", "name of this candidate (default \"HOST (pid PID, CMD)\"), shown by lockd leader, passed to CMD as "+EnvOwner)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name, argv, _ := splitRunArgs(args)
		switch {
		case rf.ttl < 0:
			return usageErrorf("--ttl must not be negative")
		case rf.grace < 0:
			return usageErrorf("--grace must not be negative")
		case strings.ContainsAny(rf.owner, "\x00\n\r"):
			return usageErrorf("--owner must not contain NUL or line breaks")
		case store.ValidateOwner(rf.owner) != nil:
			return usageErrorf("--owner: %v", store.ValidateOwner(rf.owner))
		case store.ValidateValue([]byte(ef.value)) != nil:
			return usageErrorf("--value: %v", store.ValidateValue([]byte(ef.value)))
		}
		r := &runner{e: e, flags: rf, waitForever: true, key: name, argv: argv, cmdName: "elect"}
		return r.elect(cmd.Context(), []byte(ef.value))
	}
	return cmd
}

// elect campaigns for r.key, runs the command while leader, then resigns.
func (r *runner) elect(ctx context.Context, value []byte) error {
	cf := r.flags.cf
	c, err := cf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	s, closeSession, err := r.openSession(ctx, c)
	if err != nil {
		return err
	}
	defer closeSession()

	fmt.Fprintf(r.e.stderr, "%s: campaigning in %q\n", r.prefix(), r.key)
	lead, err := s.Campaign(ctx, r.key, value)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted while campaigning in %q: %w", r.key, err)
	default:
		return r.unavailable(ctx, cf.explain(ctx, err))
	}
	fmt.Fprintf(r.e.stderr, "%s: leader of %q (token %d)\n", r.prefix(), r.key, lead.Token())
	code, err := r.runLocked(ctx, lead)
	if lead.Err() == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cf.timeout)
		if rerr := lead.Resign(rctx); rerr != nil {
			fmt.Fprintf(r.e.stderr, "%s: resign %q: %v (the leadership ends when the session closes or expires)\n", r.prefix(), r.key, rerr)
		}
		cancel()
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// leaderJSON is the JSON form of one observation of an election (lockd
// leader -o json): the value is base64, as in lockd inspect.
type leaderJSON struct {
	Name    string            `json:"name"`
	Leader  bool              `json:"leader"`
	Token   uint64            `json:"token,omitempty"`
	Session string            `json:"session,omitempty"`
	Owner   string            `json:"owner,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Value   []byte            `json:"value,omitempty"`
}

func newLeaderCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "leader [flags] NAME",
		Example: exampleLeader,
		Short:   "Print the leader of an election, or \"no leader\"",
		Long: `Leader prints the leader of the election NAME — its owner, fencing token,
session and value — or "no leader". With --watch it prints the current state,
then one line per change (a new leader, a new value, no leader) until
interrupted; it follows the server's watch and never polls.

With -o json each line is one JSON object: name, leader (false: no leader),
token, session, owner, labels and value (base64, as lockd inspect prints it).`,
		Args: exactArgs(1, "NAME"),
	}
	cf := addClientFlags(cmd, e)
	out := addOutputFlag(cmd)
	var watch bool
	cmd.Flags().BoolVar(&watch, "watch", false, "print every change of leader or value until interrupted")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		name := args[0]
		c, err := cf.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		show := func(o client.Observation) error {
			if out.json() {
				return writeJSON(e.stdout, leaderJSON{Name: o.Name, Leader: o.Leader, Token: o.Token, Session: o.Session,
					Owner: o.Owner, Labels: o.Labels, Value: o.Value})
			}
			_, err := fmt.Fprintln(e.stdout, leaderLine(o))
			return err
		}
		if !watch {
			var info client.LockInfo
			err := cf.call(cmd.Context(), func(ctx context.Context) error {
				info, err = c.Inspect(ctx, name)
				return err
			})
			if err != nil {
				return err
			}
			o := client.Observation{Name: name}
			if info.Held {
				o = client.Observation{Name: name, Leader: true, Session: info.Session, Token: info.Token,
					Owner: info.Owner, Labels: info.Labels, Value: info.Value}
			}
			return show(o)
		}
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()
		// Only establishing the watch is bounded by --timeout.
		timer := time.AfterFunc(cf.timeout, cancel)
		obs, err := c.Observe(ctx, name)
		if !timer.Stop() && cmd.Context().Err() == nil {
			return fmt.Errorf("lockd server at %s unavailable (gave up after --timeout %v): observe %q: %w",
				cf.server, cf.timeout, name, context.DeadlineExceeded)
		}
		if err != nil {
			return err
		}
		for o := range obs {
			if o.Err != nil {
				return o.Err
			}
			if err := show(o); err != nil {
				return err
			}
		}
		return nil // ctx ended: interrupted
	}
	return cmd
}

// leaderLine renders an observation for people.
func leaderLine(o client.Observation) string {
	if !o.Leader {
		return fmt.Sprintf("%s: no leader", displayKey(o.Name))
	}
	info := client.LockInfo{Key: o.Name, Held: true, Session: o.Session, Token: o.Token, Owner: o.Owner}
	line := fmt.Sprintf("%s: leader %s session %s", displayKey(o.Name), info.Holder(), o.Session)
	if len(o.Value) > 0 {
		line += fmt.Sprintf(" value %q", o.Value)
	}
	return line
}
