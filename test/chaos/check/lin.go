package check

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"lock.dev/lockd/test/chaos/history"
)

// LinOptions configures Linearizable.
type LinOptions struct {
	// Timeout bounds the search per key; 0 means DefaultLinTimeout. A key
	// whose search times out makes the result Inconclusive.
	Timeout time.Duration
	// VisualizeDir, if set, receives one porcupine HTML visualization per
	// key found not linearizable (lin-<key>.html).
	VisualizeDir string
}

// DefaultLinTimeout is the per-key search bound of Linearizable.
const DefaultLinTimeout = 30 * time.Second

// linInput is what a process asked for.
type linInput struct {
	kind  history.Kind
	proc  string
	token uint64 // release, lost: the grant's token; 0 for crash (any grant)
}

// linOutput is what it was told.
type linOutput struct {
	outcome history.Outcome
	token   uint64 // OK acquire: the granted token
}

// lockState is one key: its holder ("" if free), the holder's token (0 if
// the holder came from an ambiguous acquire and its token is unknown), and
// the least token a next grant may carry (one more than every token granted
// so far, so tokens strictly increase in linearization order).
type lockState struct {
	holder  string
	token   uint64
	minNext uint64
}

func (s lockState) freed() lockState { return lockState{minNext: s.minNext} }

// owns reports whether the state's grant is proc's grant with token (token
// 0: any of proc's grants).
func (s lockState) owns(proc string, token uint64) bool {
	return s.holder == proc && (token == 0 || s.token == 0 || s.token == token)
}

// lockStep is the nondeterministic sequential specification of one key. It
// returns every state the key may be in after the operation, none if the
// operation is impossible in state s.
func lockStep(s lockState, in linInput, out linOutput) []lockState {
	switch in.kind {
	case history.Acquire:
		if out.outcome != history.OK { // Unknown: maybe granted, token unknown
			if s.holder == "" {
				return []lockState{s, {holder: in.proc, minNext: s.minNext + 1}}
			}
			return []lockState{s}
		}
		t := out.token
		switch {
		case s.holder == "" && t >= s.minNext:
			return []lockState{{holder: in.proc, token: t, minNext: t + 1}}
		case s.holder == in.proc && s.token == t:
			return []lockState{s} // the holder re-acquired: its grant back
		case s.holder == in.proc && s.token == 0 && t+1 >= s.minNext:
			// The holder's ambiguous acquire was granted; now it learns
			// the token.
			return []lockState{{holder: in.proc, token: t, minNext: max(s.minNext, t+1)}}
		}
		return nil
	case history.Release:
		if out.outcome == history.OK {
			if s.owns(in.proc, in.token) {
				return []lockState{s.freed()}
			}
			return nil
		}
		fallthrough // Unknown: maybe released
	case history.Lost, history.Crash:
		// Trust has ended; the backend frees the key at some instant after
		// (or the release took effect), or not yet.
		if s.holder != "" && s.owns(in.proc, in.token) {
			return []lockState{s, s.freed()}
		}
		return []lockState{s}
	}
	return nil
}

var lockModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		next := lockStep(state.(lockState), input.(linInput), output.(linOutput))
		out := make([]any, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	Hash: func(state any) uint64 {
		s := state.(lockState)
		h := fnv.New64a()
		fmt.Fprintf(h, "%s\x00%d\x00%d", s.holder, s.token, s.minNext)
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch in.kind {
		case history.Acquire:
			if out.outcome == history.OK {
				return fmt.Sprintf("acquire(%s) -> %d", in.proc, out.token)
			}
			return fmt.Sprintf("acquire(%s) -> ?", in.proc)
		default:
			return fmt.Sprintf("%s(%s, %d) -> %s", in.kind, in.proc, in.token, out.outcome)
		}
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.holder == "" {
			return fmt.Sprintf("free (next token >= %d)", s.minNext)
		}
		return fmt.Sprintf("%s holds token %d (next >= %d)", s.holder, s.token, s.minNext)
	},
}).ToModel()

// Linearizable checks, key by key, that the acquire, release, lost and crash
// operations of h are linearizable with respect to a lock whose state is a
// holder and its token, with tokens strictly increasing in linearization
// order (package doc). It counts one violation per key that is not
// linearizable, and marks the result Inconclusive if a key's search timed out.
//
// Operations that certainly had no effect (Fail), writes and session opens
// are left out.
// Unknown acquires and releases are possibly applied at any instant after
// their invoke; a lost or crash op frees the key at some instant after its
// invoke (the end of trust), because the backend frees it no earlier.
func Linearizable(h history.History, opt LinOptions) Result {
	r := Result{Checker: "linearizable"}
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultLinTimeout
	}
	parts := linPartitions(h)
	for _, key := range h.Keys() {
		ops := parts[key]
		if len(ops) == 0 {
			continue
		}
		switch porcupine.CheckOperationsTimeout(lockModel, ops, opt.Timeout) {
		case porcupine.Ok:
		case porcupine.Unknown:
			r.Inconclusive = true
			r.note("key %q: search timed out after %v over %d ops", key, opt.Timeout, len(ops))
		case porcupine.Illegal:
			r.violation("key %q: not linearizable: %s", key, explainIllegal(ops, key, opt))
		}
	}
	r.note("keys checked: %d", len(parts))
	return r
}

// linPartitions turns h into porcupine operations, one slice per key.
//
// A possibly-applied op (Unknown acquire or release, lost, crash) may take
// effect at any instant after its invoke. Its window is closed at the first
// completion, at or after its invoke, of an OK acquire of the key by another
// process, rather than at infinity: taking no effect is always allowed, and
// once another process's later grant is in place, the op can only be a no-op
// (its grant, if any, is gone: that grant needed the key free; a stale
// release or loss names a token that no longer holds it), and a no-op can
// equally be placed earlier. The verdict is the same; the search is far
// smaller.
func linPartitions(h history.History) map[string][]porcupine.Operation {
	clients := map[string]int{}
	client := func(p string) int {
		id, ok := clients[p]
		if !ok {
			id = len(clients)
			clients[p] = id
		}
		return id
	}
	grants := map[string][]history.Op{} // key → OK acquires by completion
	procKeys := map[string][]string{}   // proc → keys it acquired
	for _, op := range h {
		if op.Kind == history.Acquire {
			if op.Outcome == history.OK {
				grants[op.Key] = append(grants[op.Key], op)
			}
			if !slices.Contains(procKeys[op.Proc], op.Key) {
				procKeys[op.Proc] = append(procKeys[op.Proc], op.Key)
			}
		}
	}
	for _, g := range grants {
		slices.SortStableFunc(g, func(a, b history.Op) int { return cmp.Compare(a.Complete, b.Complete) })
	}
	closeAt := func(op history.Op, key string) int64 {
		for _, g := range grants[key] {
			if g.Complete >= op.Invoke && g.Proc != op.Proc {
				return g.Complete
			}
		}
		return history.Never
	}
	parts := map[string][]porcupine.Operation{}
	add := func(op history.Op, key string) {
		in := linInput{kind: op.Kind, proc: op.Proc, token: op.Token}
		out := linOutput{outcome: op.Outcome}
		ret := op.Complete
		switch {
		case op.Kind == history.Acquire && op.Outcome == history.OK:
			out.token, in.token = op.Token, 0
		case op.Kind == history.Release && op.Outcome == history.OK:
		default:
			ret = closeAt(op, key)
		}
		op.Key = key
		parts[key] = append(parts[key], porcupine.Operation{
			ClientId: client(op.Proc), Input: in, Output: out, Call: op.Invoke, Return: ret, Metadata: op,
		})
	}
	for _, op := range h {
		switch {
		case op.Outcome == history.Fail, op.Kind == history.Write, op.Kind == history.Open:
		case op.Kind == history.Crash:
			for _, k := range procKeys[op.Proc] {
				add(op, k)
			}
		default:
			add(op, op.Key)
		}
	}
	return parts
}

// explainIllegal reruns the check with partial linearizations and names the
// longest linearizable prefix and the first operation it leaves out.
func explainIllegal(ops []porcupine.Operation, key string, opt LinOptions) string {
	res, info := porcupine.CheckOperationsVerbose(lockModel, ops, opt.Timeout)
	if res != porcupine.Illegal {
		return fmt.Sprintf("(verbose recheck said %s)", res)
	}
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	in := map[history.Op]bool{}
	for _, o := range longest {
		in[o.Metadata.(history.Op)] = true
	}
	var left history.Op
	found := false
	for _, o := range ops { // ops are in history (invoke) order
		if m := o.Metadata.(history.Op); !in[m] {
			left, found = m, true
			break
		}
	}
	msg := fmt.Sprintf("the longest linearizable prefix has %d of %d ops", len(longest), len(ops))
	if len(longest) > 0 {
		msg += fmt.Sprintf(", ending with %v", longest[len(longest)-1].Metadata.(history.Op))
	}
	if found {
		msg += fmt.Sprintf("; first op left out: %v", left)
	}
	if opt.VisualizeDir != "" {
		path := filepath.Join(opt.VisualizeDir, "lin-"+unsafeChars.ReplaceAllString(key, "_")+".html")
		if err := os.MkdirAll(opt.VisualizeDir, 0o755); err != nil {
			msg += fmt.Sprintf(" (visualize: %v)", err)
		} else if err := porcupine.VisualizePath(lockModel, info, path); err != nil {
			msg += fmt.Sprintf(" (visualize: %v)", err)
		} else {
			msg += " (see " + path + ")"
		}
	}
	return msg
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)
