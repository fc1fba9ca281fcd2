package check

import (
	"lock.dev/lockd/test/chaos/history"
)

// PausesHitHolders checks that every pause of a holder (SIGSTOP past its
// TTL, given as deaths at the instant of the SIGSTOP) exercised fencing:
//
//   - the paused process held a key then (one of its trust intervals,
//     TrustIntervals, contains the instant): a pause that hit a process
//     holding nothing tested nothing;
//   - after it resumed, the fenced resource refused a write of that grant
//     (a Write op of the process with the key and token, invoked after the
//     pause, that failed): its successor wrote with a higher token while it
//     was stopped. A pause that ends with the old grant's write accepted
//     means nobody took the key over, so the token check was not tested.
//
// A pause can race the critical section: if the holder sent its second
// write before the stop took effect, that write is invoked inside the pause
// (after At, before Until), which a stopped process cannot do. The runner
// prevents it (the worker waits for the runner's answer to its hold line,
// given after the stop), so such a pause is a violation of its own, named
// as a race, to tell a broken harness from a pause that found nobody
// taking the key over.
//
// It counts one violation per pause that fails either.
func PausesHitHolders(h history.History, pauses []Death) Result {
	r := Result{Checker: "pauses-hit-holders"}
	ivs := TrustIntervals(h)
	refused := 0
	for _, p := range pauses {
		var held *Interval
		for i := range ivs {
			if iv := &ivs[i]; iv.Proc == p.Proc && iv.Start <= p.At && iv.End >= p.At && !iv.Empty() {
				held = iv
				break
			}
		}
		if held == nil {
			r.violation("pause of %s at %s: it held no key then", p.Proc, history.FormatTime(p.At))
			continue
		}
		hit, early := false, false
		for _, op := range h {
			if op.Proc != p.Proc || op.Kind != history.Write || op.Key != held.Key || op.Token != held.Token ||
				op.Invoke < p.At {
				continue
			}
			if op.Outcome == history.Fail {
				hit = true
				break
			}
			if p.Until > 0 && op.Invoke < p.Until && op.Outcome == history.OK {
				early = true
			}
		}
		if !hit && early {
			r.violation("pause of %s at %s holding %q (token %d) raced its second write (sent before the stop took effect)",
				p.Proc, history.FormatTime(p.At), held.Key, held.Token)
			continue
		}
		if !hit {
			r.violation("pause of %s at %s holding %q (token %d): no write of that grant was refused after it",
				p.Proc, history.FormatTime(p.At), held.Key, held.Token)
			continue
		}
		refused++
	}
	r.note("%d pauses, %d hit a holder whose late write was refused", len(pauses), refused)
	return r
}
