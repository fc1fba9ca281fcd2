package cli

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/config"
	"lock.dev/lockd/server"
)

func newAuthCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Check access rules and make bearer-token entries (offline; docs/contracts/C5.md #ct5-auth)",
		Args:  exactArgs(0, "a subcommand: check or hash-token"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(e.stderr)
			_ = cmd.Help()
			return &exitError{code: ExitUsage}
		},
	}
	cmd.AddCommand(newAuthCheckCmd(e), newAuthHashCmd(e))
	return cmd
}

func newAuthCheckCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check PRINCIPAL ACTION KEY",
		Short: "Print whether PRINCIPAL may do ACTION (read, lock, admin) on KEY, and the rule that decides",
		Long: `Check decides one call against a policy file exactly as lockd serve does,
without a server, and prints the decision and the rule that made it:

  allowed: alice may lock billing/invoice (rule "billing", line 3)
  denied: bob may not admin billing/invoice (default-deny: no rule allows it)

PRINCIPAL is a certificate's URI SAN or CN, a token's principal, or
"anonymous". ACTION is read (Inspect, List, Watch), lock (sessions,
Acquire, Release) or admin (Revoke). KEY "" asks about any key (the
session calls); admin with KEY "" asks about listing every session
(ListSessions), which needs admin on every key (a rule with prefix "*"),
as lockd serve decides it. With --prefix, KEY is a List/Watch prefix and the answer
says whether every key under it, only some (results filtered), or none
may be read.

Under a policy it then prints the principal's seven per-principal shares as
lockd serve applies them, each with where it comes from: the policy's
limits: list (with the entry's line), a lock.server.principal.* key, or
25 % of the global bound; a principal no rule names holds no connection
(docs/contracts/C5.md #ct5-principal-limits). The server's keys are read
as lockd serve reads them: --config FILE, then LOCKD_* variables, then the
defaults.

The policy file is --policy-file, else lock.auth.policy-file (--config or
LOCKD_AUTH_POLICY_FILE); without one, everything is allowed (rule
no-policy), as in lockd serve. The exit status is 0 when allowed, 1 when
denied or the file is malformed.`,
		Args: exactArgs(3, "PRINCIPAL ACTION KEY"),
	}
	policyFile := cmd.Flags().String("policy-file", "", "policy file (default $LOCKD_AUTH_POLICY_FILE)")
	prefix := cmd.Flags().Bool("prefix", false, "KEY is a List/Watch prefix")
	configFile := cmd.Flags().String("config", "", "the server's YAML configuration file, for its shares (as lockd serve --config)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		principal, actText, key := args[0], args[1], args[2]
		act, ok := auth.ParseAction(actText)
		if !ok {
			return usageErrorf("unknown action %q (want read, lock or admin)", actText)
		}
		cfs := pflag.NewFlagSet("config", pflag.ContinueOnError)
		cfs.String("config", *configFile, "")
		cfg, err := config.Load(cfs, e.environ)
		if err != nil {
			return err
		}
		path := *policyFile
		if path == "" {
			path = cfg.Auth.PolicyFile
		}
		var p *auth.Policy
		if path != "" {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if p, err = auth.ParsePolicy(b); err != nil {
				return fmt.Errorf("policy file %s: %w", path, err)
			}
		}
		var (
			allowed bool
			rule    string
			verb    = string(act)
			what    = displayKey(key)
		)
		if key == "" {
			what = "any key"
		}
		if *prefix {
			var all bool
			all, allowed, rule = p.Scope(principal, act, key)
			switch {
			case all:
				what = fmt.Sprintf("every key under %q", key)
			case allowed:
				what = fmt.Sprintf("some keys under %q (results filtered to them)", key)
			default:
				what = fmt.Sprintf("any key under %q", key)
			}
		} else if key == "" && act == auth.ActionAdmin {
			// admin on no key is ListSessions of every session: the
			// server needs admin on every key for it (C5 #ct5-auth).
			var all bool
			all, _, rule = p.Scope(principal, act, "")
			allowed, what = all, "every session (ListSessions needs admin on every key)"
			if !all && rule != auth.RuleNoPolicy {
				rule = auth.RuleDefaultDeny
			}
		} else {
			allowed, rule = p.Decide(principal, act, key)
		}
		if !allowed {
			fmt.Fprintf(e.stdout, "denied: %s may not %s %s (%s)\n", principal, verb, what, describeRule(p, rule))
			printShares(e, cfg.Server, p, principal)
			return &exitError{code: ExitError}
		}
		if _, err := fmt.Fprintf(e.stdout, "allowed: %s may %s %s (%s)\n", principal, verb, what, describeRule(p, rule)); err != nil {
			return err
		}
		printShares(e, cfg.Server, p, principal)
		return nil
	}
	return cmd
}

// printShares prints the principal's shares under p as a server with cfg
// applies them (server.PrincipalShares, C5 #ct5-principal-limits); nothing
// without a policy.
func printShares(e *env, cfg server.Config, p *auth.Policy, principal string) {
	shares := server.PrincipalShares(cfg, p, principal)
	if len(shares) == 0 {
		return
	}
	fmt.Fprintf(e.stdout, "limits of %s (per-principal shares):\n", principal)
	for _, ps := range shares {
		var from string
		switch ps.Source {
		case server.SharePolicy:
			from = fmt.Sprintf("policy limits:, line %d", ps.Line)
		case server.ShareKey:
			from = ps.Key
		case server.ShareDefault:
			from = fmt.Sprintf("25 %% of %s (%d)", ps.Global, ps.GlobalValue)
		case server.ShareNoRule:
			from = fmt.Sprintf("no rule names %s: it holds no connection", principal)
		}
		fmt.Fprintf(e.stdout, "  %s %d (%s)\n", ps.Limit, ps.N, from)
	}
}

// describeRule says which rule decided: its name and line, or why none.
func describeRule(p *auth.Policy, rule string) string {
	switch rule {
	case auth.RuleNoPolicy:
		return "no-policy: no policy file, every call is allowed"
	case auth.RuleDefaultDeny:
		return "default-deny: no rule allows it"
	}
	for _, r := range p.Rules() {
		if r.Name == rule {
			return fmt.Sprintf("rule %q, line %d", r.Name, r.Line)
		}
	}
	return fmt.Sprintf("rule %q", rule)
}

func newAuthHashCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "hash-token PRINCIPAL",
		Short: "Read a bearer token from stdin and print its tokens-file line for PRINCIPAL",
		Long: `Hash-token reads one bearer token (the first line of stdin) and prints the
line that gives it to PRINCIPAL in lock.auth.tokens-file: the token's
SHA-256 and the principal. The token itself never goes into the file.

  TOKEN=$(openssl rand -hex 32)
  printf '%s\n' "$TOKEN" | lockd auth hash-token alice >> tokens`,
		Args: exactArgs(1, "PRINCIPAL"),
		RunE: func(_ *cobra.Command, args []string) error {
			line, err := bufio.NewReader(e.stdin).ReadString('\n')
			token := strings.TrimRight(line, "\r\n")
			if token == "" {
				if err != nil {
					return fmt.Errorf("read the token from stdin: %w", err)
				}
				return fmt.Errorf("the token on stdin is empty")
			}
			_, err = fmt.Fprintf(e.stdout, "%s  %s\n", auth.HashToken(token), args[0])
			return err
		},
	}
}
