package hotkeys

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestSpaceSaving: over a skewed stream of many more keys than slots, every
// listed score is at least the key's true total and at most its total plus
// its overcount, and the truly hottest keys are listed first.
func TestSpaceSaving(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	k := New(clk.Now)
	rng := rand.New(rand.NewPCG(1, 2))
	truth := map[string]uint64{}
	for i := range 20000 {
		key := fmt.Sprintf("k/%d", rng.IntN(5000))
		if i%4 == 0 {
			key = fmt.Sprintf("hot/%d", i%5) // five heavy hitters: a quarter of the stream
		}
		k.Contended(key)
		truth[key]++
	}
	top := k.Top(ByContention, "", nil, MaxLimit)
	if len(top) != MaxLimit {
		t.Fatalf("%d entries; want %d", len(top), MaxLimit)
	}
	for i, e := range top {
		if e.Score < truth[e.Key] || e.Score-e.Overcount > truth[e.Key] {
			t.Errorf("%s: score %d overcount %d; true total %d", e.Key, e.Score, e.Overcount, truth[e.Key])
		}
		if i < 5 && !strings.HasPrefix(e.Key, "hot/") {
			t.Errorf("rank %d is %s (%d); want a hot/ key", i, e.Key, e.Score)
		}
	}
}

// TestWindow: a score covers the last half to the whole window; older
// observations are dropped, and waits and holds rank by summed time.
func TestWindow(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	k := New(clk.Now)
	k.Waited("a", 3*time.Second)
	k.Waited("b", time.Second)
	k.Held("b", 5*time.Second)
	clk.Add(Half)
	k.Waited("b", 4*time.Second) // b: 5 s over the window
	got := k.Top(ByWait, "", nil, 10)
	if len(got) != 2 || got[0] != (Entry{"b", 5e6, 0}) || got[1] != (Entry{"a", 3e6, 0}) {
		t.Errorf("by wait after one half: %v; want b 5e6, a 3e6", got)
	}
	if got := k.Top(ByHold, "", nil, 10); len(got) != 1 || got[0].Key != "b" {
		t.Errorf("by hold: %v; want b", got)
	}
	clk.Add(Half) // the first half leaves the window
	if got := k.Top(ByWait, "", nil, 10); len(got) != 1 || got[0] != (Entry{"b", 4e6, 0}) {
		t.Errorf("by wait after the first half left: %v; want b 4e6", got)
	}
	clk.Add(Window)
	if got := k.Top(ByWait, "", nil, 10); len(got) != 0 {
		t.Errorf("by wait after the window: %v; want none", got)
	}
}

// TestFilter: Top keeps the keys under the prefix that allow accepts, before
// the limit: a caller allowed one prefix sees none of another's keys.
func TestFilter(t *testing.T) {
	k := New(nil)
	for i := range 20 {
		k.Contended(fmt.Sprintf("alice/%d", i))
		for range 3 {
			k.Contended(fmt.Sprintf("bob/%d", i)) // hotter than every alice key
		}
	}
	alice := func(key string) bool { return strings.HasPrefix(key, "alice/") }
	got := k.Top(ByContention, "", alice, 5)
	if len(got) != 5 {
		t.Fatalf("%d entries for alice; want 5 of hers", len(got))
	}
	for _, e := range got {
		if !alice(e.Key) {
			t.Errorf("alice sees %s", e.Key)
		}
	}
	if got := k.Top(ByContention, "bob/1", nil, 50); len(got) != 11 { // bob/1, bob/10 … bob/19
		t.Errorf("prefix bob/1: %d entries; want 11", len(got))
	}
	var nilKeys *Keys
	nilKeys.Contended("x")
	if got := nilKeys.Top(ByContention, "", nil, 5); got != nil {
		t.Errorf("a nil Keys answered %v", got)
	}
}

// TestMemoryBound: every slot of every half of every sketch holding a key of
// the longest length keeps the heap under MaxBytes (C4 #ct4-hotkeys); the
// control: the keys alone are measured (more than Rankings × 2 × Slots × 512).
func TestMemoryBound(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	k := New(clk.Now)
	fill := func(round int) {
		for i := range Slots {
			key := fmt.Sprintf("%d/%d/", round, i)
			key += strings.Repeat("x", 512-len(key))
			k.Waited(key, time.Millisecond)
			k.Held(key, time.Millisecond)
			k.Contended(key)
		}
	}
	fill(0)
	clk.Add(Half)
	fill(1)
	for r := range Rankings {
		for _, h := range []*half{&k.sk[r].cur, &k.sk[r].prev} {
			if len(h.slots) != Slots {
				t.Fatalf("ranking %d: a half holds %d slots; want %d", r, len(h.slots), Slots)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d slots of 512-byte keys hold %d B (bound %d B)", int(Rankings)*2*Slots, held, MaxBytes)
	if held > int64(MaxBytes) {
		t.Errorf("the sketches hold %d B; the bound is %d B", held, MaxBytes)
	}
	if keys := int64(Rankings) * 2 * Slots * 512; held < keys {
		t.Errorf("measured %d B, less than the keys' own %d B: the measure is broken", held, keys)
	}
	runtime.KeepAlive(k)
}

// BenchmarkObserve: the cost of one observation, on a key already tracked
// and on a stream of distinct keys that evicts.
func BenchmarkObserve(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("jobs/%d", i)
	}
	b.Run("tracked", func(b *testing.B) {
		k := New(nil)
		for i := 0; b.Loop(); i++ {
			k.Waited(keys[i%100], time.Millisecond)
		}
	})
	b.Run("evicting", func(b *testing.B) {
		k := New(nil)
		for i := 0; b.Loop(); i++ {
			k.Waited(keys[i%len(keys)], time.Millisecond)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		k := New(nil)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				k.Contended(keys[i%len(keys)])
				i++
			}
		})
	})
}
