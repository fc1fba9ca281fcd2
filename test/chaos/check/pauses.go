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
// A pause can race the critical section: the runner stops a holder when it
// reads the "hold" line, and on a loaded machine the holder may already
// have sent its second write before the stop takes effect. Such a write is
// invoked inside the pause (after At, before Until), which a stopped
// process cannot do, so the checker knows it went out before the stop; if
// it was accepted and no later write of the grant was refused, the pause
// raced and tested nothing, without anything being wrong. Raced pauses are
// counted in the note, not as violations, as long as at least one pause of
// the run hit; a run whose every pause raced is one violation.
//
// It counts one violation per pause that fails either (and is not raced).
func PausesHitHolders(h history.History, pauses []Death) Result {
	r := Result{Checker: "pauses-hit-holders"}
	ivs := TrustIntervals(h)
	refused, raced := 0, 0
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
			raced++
			continue
		}
		if !hit {
			r.violation("pause of %s at %s holding %q (token %d): no write of that grant was refused after it",
				p.Proc, history.FormatTime(p.At), held.Key, held.Token)
			continue
		}
		refused++
	}
	if raced > 0 && refused == 0 {
		r.violation("all %d pauses that hit a holder raced its write (sent before the stop took effect): fencing was never tested", raced)
	}
	r.note("%d pauses, %d hit a holder whose late write was refused, %d raced the holder's write", len(pauses), refused, raced)
	return r
}
