package worker

import (
	"context"
	"errors"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

// PairWait bounds a pair worker's wait for its second key
// (client.WithWaitTimeout): far above the deadlock bound (C2
// #ct2-deadlock, 2 s), so that with the detector off a cycle stays closed
// long enough for check.DeadlocksResolved to see it.
const PairWait = 10 * time.Second

// held is one grant of a pair worker.
type held struct {
	l       *client.Lock
	key     string
	tok     uint64
	lost    *lostOnce
	watched chan struct{}
}

// pairIteration is the iteration of a pair worker (Config.Pairs): take
// Keys[0], write, hold (its hold line), then, still holding it, wait for
// Keys[1] (at most PairWait; a refusal as a deadlock is recorded as a
// failed acquire with its error), write and release it if granted, then
// write and release Keys[0]. Workers given the two keys in opposite orders
// close cycles of waits, which lockd must refuse (C2 #ct2-deadlock).
func (w *worker) pairIteration(ctx context.Context) {
	first, second := w.cfg.Keys[0], w.cfg.Keys[1]
	sess := w.session(ctx, first)
	if sess == nil {
		return
	}
	w.say("wait %s %s", first, sess.ID())
	g1, err := w.take(ctx, sess, first)
	if err != nil {
		w.say("free %s", first)
		pause(ctx, retryPause)
		return
	}
	w.write(first, fenced.ModePlain, g1.tok)
	w.say("hold %s %d 1 plain %s", first, g1.tok, w.peer())
	time.Sleep(w.holdTime()) // the critical section: not cut short by a stop
	if w.cfg.HoldAck != nil {
		_, _ = w.cfg.HoldAck.ReadString('\n')
	}
	w.say("waitpair %s %s", second, first)
	if g2, err := w.take(ctx, sess, second, client.WithWaitTimeout(PairWait)); err == nil {
		w.write(second, fenced.ModePlain, g2.tok)
		w.write(second, fenced.ModePlain, g2.tok)
		w.release(sess, g2)
	}
	w.write(first, fenced.ModePlain, g1.tok)
	w.release(sess, g1)
	w.say("free %s", first)
}

// holdTime is a random hold between HoldMin and HoldMax.
func (w *worker) holdTime() time.Duration {
	hold := w.cfg.HoldMin
	if d := w.cfg.HoldMax - w.cfg.HoldMin; d > 0 {
		hold += time.Duration(w.rng.Int64N(int64(d) + 1))
	}
	return hold
}

// take acquires key (plain) and records it; a refusal as a deadlock is a
// failed acquire (the refused wait left the queue and was granted nothing,
// C2 #ct2-deadlock). The grant's trust is watched as iteration does.
func (w *worker) take(ctx context.Context, sess *client.Session, key string, opts ...client.AcquireOption) (*held, error) {
	call := w.rec.InvokeMode(history.Acquire, key, fenced.ModePlain, 0)
	l, err := sess.Acquire(ctx, key, opts...)
	if err != nil {
		out := acquireOutcome(err)
		if errors.Is(err, client.ErrDeadlock) {
			out = history.Fail
		}
		w.rec.Complete(call, out, 0, err)
		return nil, err
	}
	g := &held{l: l, key: key, tok: l.Token(), lost: &lostOnce{}, watched: make(chan struct{})}
	w.rec.Complete(call, history.OK, g.tok, nil)
	go func() { // exits when Done closes: the release closes it at the latest
		defer close(g.watched)
		<-l.Done()
		if !errors.Is(l.Err(), client.ErrReleased) {
			g.lost.record(w.rec, key, g.tok, w.realTime(sess.Deadline()), "done closed: "+l.Err().Error())
		}
	}()
	return g, nil
}

// release releases g and records it, as iteration does.
func (w *worker) release(sess *client.Session, g *held) {
	relAt := time.Now()
	if end := w.realTime(sess.Deadline()); end.Before(relAt) {
		g.lost.record(w.rec, g.key, g.tok, end, "deadline passed before the release (Done not closed yet)")
	}
	call := w.rec.Invoke(history.Release, g.key, g.tok)
	rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	err := g.l.Release(rctx)
	cancel()
	outcome := releaseOutcome(err)
	w.rec.Complete(call, outcome, 0, err)
	if outcome == history.Fail {
		g.lost.record(w.rec, g.key, g.tok, relAt, "release refused: "+err.Error())
	}
	<-g.watched
}
