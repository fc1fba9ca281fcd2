package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpExamplesParse: the commands of issue #15 and those that show its
// holders have a Short, a Long and an Example; every "lockd …" line of
// every command's Example names that command and parses with its flags and
// arguments, so help never shows a flag or a form that does not work.
func TestHelpExamplesParse(t *testing.T) {
	t.Parallel()
	newTree := func() *cobra.Command {
		return newRoot(&env{stdout: io.Discard, stderr: io.Discard, environ: func() []string { return nil }})
	}
	must := map[string]bool{"run": true, "elect": true, "leader": true, "sessions": true, "inspect": true, "ls": true, "watch": true}
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if must[c.Name()] {
			delete(must, c.Name())
			if c.Short == "" || c.Long == "" || c.Example == "" {
				t.Errorf("lockd %s: Short %q, Long %d bytes, Example %d bytes; want all three", c.Name(), c.Short, len(c.Long), len(c.Example))
			}
		}
		for line := range strings.Lines(c.Example) {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "lockd ") {
				continue
			}
			checked++
			args := strings.Fields(line)[1:]
			cmd, rest, err := newTree().Find(args)
			if err != nil || cmd.CommandPath() != c.CommandPath() {
				t.Errorf("example %q of %q: finds command %q, %v", line, c.CommandPath(), cmd.CommandPath(), err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("example %q: flags: %v", line, err)
				continue
			}
			if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
				t.Errorf("example %q: arguments: %v", line, err)
			}
		}
	}
	walk(newTree())
	if len(must) > 0 {
		t.Errorf("commands not found: %v", must)
	}
	if checked < len([]string{"run", "elect", "leader", "sessions", "inspect", "ls", "watch"}) {
		t.Errorf("checked %d example lines; want at least one per command", checked)
	}
}
