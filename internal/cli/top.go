package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/cobra"

	"lock.dev/lockd/client"
)

// lockd top: a live terminal view of the holders (from the watch stream,
// seeded by one List) and the hot keys (HotKeys, polled) under a prefix
// (C2 #ct2-hotkeys). bubbletea draws it; q or ctrl+c quits.

// topHolder is one held key as the watch reported it.
type topHolder struct {
	token   uint64
	session string
	owner   string
	since   time.Time // when top learnt of the grant (or the server's acquired-at)
}

// topWait is a key with waiters: how many, and the wait estimates of the
// first and last in line (C2 #ct2-wait-estimate; has false: none).
type topWait struct {
	key         string
	n           int
	first, last time.Duration
	has         bool
}

// topModel is the bubbletea model of lockd top.
type topModel struct {
	server, prefix string
	holders        map[string]topHolder
	hot            client.HotKeysInfo
	waits          []topWait // the keys by contention that have waiters now
	polled         time.Time
	err            string
	now            func() time.Time
}

type (
	topEventMsg client.Event
	topHotMsg   struct {
		hk    client.HotKeysInfo
		waits []topWait
		err   error
	}
	topWatchEndMsg struct{ err error }
)

func (m *topModel) Init() tea.Cmd { return nil }

func (m *topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		}
	case topEventMsg:
		switch client.EventKind(msg.Kind) {
		case client.EventAcquired:
			m.holders[msg.Key] = topHolder{token: msg.Token, session: msg.Session, owner: msg.Owner, since: m.now()}
		case client.EventReleased, client.EventExpired, client.EventRevoked:
			if h, ok := m.holders[msg.Key]; ok && h.token <= msg.Token {
				delete(m.holders, msg.Key)
			}
		}
	case topHotMsg:
		m.polled = m.now()
		if msg.err != nil {
			m.err = "hot keys: " + msg.err.Error()
		} else {
			m.hot, m.waits, m.err = msg.hk, msg.waits, ""
		}
	case topWatchEndMsg:
		m.err = "watch ended: " + msg.err.Error()
	}
	return m, nil
}

func (m *topModel) View() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lockd top — %s, prefix %q (q quits)\n\n", m.server, m.prefix)
	keys := make([]string, 0, len(m.holders))
	for k := range m.holders {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(&b, "HOLDERS (%d)\n", len(keys))
	fmt.Fprintf(&b, "  %-32s %8s %-20s %-16s %s\n", "KEY", "TOKEN", "SESSION", "OWNER", "HELD")
	now := m.now()
	for i, k := range keys {
		if i == 15 {
			fmt.Fprintf(&b, "  … %d more\n", len(keys)-i)
			break
		}
		h := m.holders[k]
		fmt.Fprintf(&b, "  %-32s %8d %-20s %-16s %s\n", displayKey(k), h.token, h.session, h.owner, now.Sub(h.since).Truncate(time.Second))
	}
	if len(m.waits) > 0 {
		b.WriteString("\nWAITERS (keys by contention; estimates are not promises)\n")
		for _, w := range m.waits {
			est := "no estimate yet"
			if w.has {
				est = fmt.Sprintf("next in ~%.1fs, last in ~%.1fs", w.first.Seconds(), w.last.Seconds())
			}
			fmt.Fprintf(&b, "  %-32s %4d waiting  %s\n", displayKey(w.key), w.n, est)
		}
	}
	if !m.hot.Enabled && !m.polled.IsZero() && m.err == "" {
		b.WriteString("\nHOT KEYS: off on this server (lock.server.stats.enabled)\n")
	} else {
		fmt.Fprintf(&b, "\nHOT KEYS (this lockd, last %v)\n", m.hot.Window)
		section := func(title, unit string, hs []client.HotKey) {
			fmt.Fprintf(&b, "  %s\n", title)
			if len(hs) == 0 {
				b.WriteString("    (none)\n")
			}
			for _, h := range hs {
				fmt.Fprintf(&b, "    %-32s %10d %s\n", displayKey(h.Key), h.Score, unit)
			}
		}
		section("by wait", "ms", m.hot.ByWait)
		section("by hold", "ms", m.hot.ByHold)
		section("by contention", "waiting acquires", m.hot.ByContention)
	}
	if m.err != "" {
		fmt.Fprintf(&b, "\n! %s\n", m.err)
	}
	return b.String()
}

func newTopCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top [PREFIX]",
		Short: "A live terminal view of holders and hot keys under PREFIX (q quits)",
		Long: `Top shows the keys held under PREFIX (all keys without one), kept current
from the watch stream, and the hot keys of the lockd process it is
connected to — by summed wait, summed hold and waiting acquires over the
last 30 to 60 seconds (C2 #ct2-hotkeys) — polled every --interval. The keys
ranked by waiting acquires that have waiters now are inspected each poll:
how many wait, and the server's wait estimates of the first and last in
line (C2 #ct2-wait-estimate; not promises). Keys the caller may not read
are not shown. q, Esc or Ctrl+C quits.`,
		Args: maxArgs(1, "at most a PREFIX"),
	}
	cf := addClientFlags(cmd, e)
	interval := cmd.Flags().Duration("interval", 2*time.Second, "how often to ask for the hot keys (at least 100ms)")
	limit := cmd.Flags().Int("limit", 10, "keys per hot-key ranking (1..50)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *interval < 100*time.Millisecond {
			return usageErrorf("--interval %v: at least 100ms", *interval)
		}
		if *limit < 1 || *limit > 50 {
			return usageErrorf("--limit %d: want 1..50", *limit)
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
		setup, stop := context.WithTimeout(ctx, cf.timeout)
		defer stop()
		m := &topModel{server: cf.server, prefix: prefix, holders: map[string]topHolder{}, now: time.Now}
		locks, _, err := c.List(setup, prefix, client.ListOptions{Limit: 1000})
		if err != nil {
			return err
		}
		for _, l := range locks {
			if l.Held {
				since := l.AcquiredAt
				if since.IsZero() {
					since = time.Now()
				}
				m.holders[l.Key] = topHolder{token: l.Token, session: l.Session, owner: l.Owner, since: since}
			}
		}
		events, err := c.Watch(setup, prefix, client.WithHolders())
		if err != nil {
			return err
		}
		p := tea.NewProgram(m, tea.WithInput(e.stdin), tea.WithOutput(e.stdout), tea.WithContext(ctx), tea.WithoutSignalHandler())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		wg.Add(2)
		go func() { // the watch's events; ends with ctx (the watch closes its channel)
			defer wg.Done()
			for ev := range events {
				if ev.Err != nil {
					p.Send(topWatchEndMsg{ev.Err})
					continue
				}
				p.Send(topEventMsg(ev))
			}
		}()
		go func() { // the hot-key poll; ends with ctx
			defer wg.Done()
			t := time.NewTicker(*interval)
			defer t.Stop()
			for {
				hk, err := c.HotKeys(ctx, prefix, *limit)
				if ctx.Err() != nil {
					return
				}
				p.Send(topHotMsg{hk, topWaits(ctx, c, hk), err})
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
		if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) && cmd.Context().Err() == nil {
			return err
		}
		return nil
	}
	return cmd
}

// topWaits inspects the keys of hk's contention ranking (at most its
// limit) and returns those with waiters, with their wait estimates.
func topWaits(ctx context.Context, c *client.Client, hk client.HotKeysInfo) []topWait {
	var ws []topWait
	for _, h := range hk.ByContention {
		info, err := c.Inspect(ctx, h.Key)
		if err != nil || len(info.Waiters) == 0 {
			continue
		}
		w := topWait{key: h.Key, n: len(info.Waiters)}
		if es := info.WaitEstimates; len(es) > 0 {
			w.first, w.last, w.has = es[0].Wait, es[len(es)-1].Wait, true
		}
		ws = append(ws, w)
	}
	return ws
}
