package check

import (
	"context"
	"testing"
	"time"

	"lock.dev/lockd/test/chaos/fenced"
)

func writes(ws ...fenced.Write) []fenced.Write {
	for i := range ws {
		ws[i].Seq = uint64(i + 1)
		ws[i].At = int64(i) * ms
	}
	return ws
}

func w(key, writer string, token uint64) fenced.Write {
	return fenced.Write{Key: key, Writer: writer, Token: token}
}

func TestFencedSafety(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		wantOK(t, FencedSafety(writes(w("k", "a", 5), w("k", "a", 5), w("j", "b", 1), w("k", "b", 7), w("k", "b", 7), w("j", "a", 2))))
	})
	t.Run("stale write", func(t *testing.T) {
		wantCaught(t, FencedSafety(writes(w("k", "a", 5), w("k", "b", 7), w("k", "a", 5))), 1, "write #3 by a with token 5")
	})
	t.Run("one token two writers", func(t *testing.T) {
		wantCaught(t, FencedSafety(writes(w("k", "a", 5), w("k", "b", 5))), 1, "token 5 used by a")
	})
}

func TestOverlappingWriters(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		// a holds twice with two grants; b in between: no overlap.
		wantOK(t, OverlappingWriters(writes(w("k", "a", 5), w("k", "a", 5), w("k", "b", 7), w("j", "a", 1), w("k", "b", 7), w("k", "a", 9), w("k", "a", 9))))
	})
	t.Run("A B A", func(t *testing.T) {
		wantCaught(t, OverlappingWriters(writes(w("k", "a", 5), w("k", "b", 7), w("k", "a", 5), w("k", "b", 7))), 2,
			"a (token 5) wrote at #1 and again at #3", "b (token 7) wrote at #2 and again at #4")
	})
}

// The control principle end to end through the real fenced resource: a
// paused holder a resumes and writes with its old token after b took over.
// With the check on both checkers pass; with it off both must fail.
func TestFencedControlThroughServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, checkTokens := range []bool{true, false} {
		s, err := fenced.Start(fenced.Config{CheckTokens: checkTokens})
		if err != nil {
			t.Fatalf("fenced.Start: %v", err)
		}
		c := fenced.NewClient(s.URL())
		for _, st := range []struct {
			writer string
			token  uint64
		}{{"a", 5}, {"b", 7}, {"a", 5}, {"b", 7}} {
			_, _ = c.Write(ctx, "k", st.writer, st.token) // refusals are the point
		}
		c.Close()
		ws := s.Writes()
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		safety, overlap := FencedSafety(ws), OverlappingWriters(ws)
		if checkTokens {
			wantOK(t, safety)
			wantOK(t, overlap)
			continue
		}
		if safety.Violations == 0 || overlap.Violations == 0 {
			t.Fatalf("control run (check off) must fail both checkers, got\n%s\n%s", safety, overlap)
		}
	}
}
