package events

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuf collects JSON log records for assertions.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func newTest(t *testing.T, buffer int, interval time.Duration, now func() time.Time) (*Broadcaster[int], *logBuf) {
	t.Helper()
	lb := &logBuf{}
	return New[int](Options{Buffer: buffer, LogInterval: interval, Now: now, Log: slog.New(slog.NewJSONHandler(lb, nil))}), lb
}

func drain(s *Subscription[int]) []int {
	var out []int
	for {
		select {
		case v, ok := <-s.C():
			if !ok {
				return out
			}
			out = append(out, v)
		default:
			return out
		}
	}
}

func TestBroadcastDelivery(t *testing.T) {
	tests := []struct {
		name        string
		buffer      int
		publish     int
		wantGot     []int
		wantDropped uint64
	}{
		{name: "fits", buffer: 4, publish: 3, wantGot: []int{0, 1, 2}},
		{name: "exactly full", buffer: 3, publish: 3, wantGot: []int{0, 1, 2}},
		// The oldest values are kept: a reader that catches up sees a gap at the
		// end, never values out of order.
		{name: "overflow drops newest", buffer: 2, publish: 5, wantGot: []int{0, 1}, wantDropped: 3},
		{name: "nothing published", buffer: 2, publish: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newTest(t, tc.buffer, 0, nil)
			a, c := b.Subscribe("a"), b.Subscribe("c")
			defer a.Close()
			defer c.Close()
			for i := range tc.publish {
				b.Publish(i)
			}
			for _, s := range []*Subscription[int]{a, c} {
				if got := drain(s); !equal(got, tc.wantGot) {
					t.Errorf("%s got %v, want %v", s.name, got, tc.wantGot)
				}
				if s.Dropped() != tc.wantDropped {
					t.Errorf("%s dropped %d, want %d", s.name, s.Dropped(), tc.wantDropped)
				}
			}
			if got := b.Dropped(); got != 2*tc.wantDropped {
				t.Errorf("broadcaster dropped %d, want %d", got, 2*tc.wantDropped)
			}
		})
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A subscriber that never reads must not slow down or starve another one.
func TestStuckSubscriberDoesNotBlock(t *testing.T) {
	b, _ := newTest(t, 8, 0, nil)
	stuck := b.Subscribe("stuck")
	defer stuck.Close()
	live := b.Subscribe("live")
	defer live.Close()
	const n = 10000
	got := make(chan int, 1)
	go func() {
		count := 0
		for v := range live.C() {
			if v != count {
				t.Errorf("live got %d, want %d", v, count)
			}
			count++
			if count == n {
				break
			}
		}
		got <- count
	}()
	done := make(chan struct{})
	go func() {
		for i := range n {
			// Paced so the live reader keeps up; the stuck one must still not block.
			for len(live.ch) == cap(live.ch) {
				time.Sleep(time.Microsecond)
			}
			b.Publish(i)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a subscriber that never reads")
	}
	if c := <-got; c != n {
		t.Fatalf("live subscriber got %d of %d", c, n)
	}
	if stuck.Dropped() != n-8 || live.Dropped() != 0 {
		t.Fatalf("dropped: stuck %d (want %d), live %d", stuck.Dropped(), n-8, live.Dropped())
	}
}

func TestCloseRemovesSubscriber(t *testing.T) {
	b, lb := newTest(t, 1, 0, nil)
	s := b.Subscribe("peer-1")
	b.Publish(1)
	b.Publish(2) // dropped
	if b.Subscribers() != 1 {
		t.Fatalf("subscribers %d", b.Subscribers())
	}
	s.Close()
	s.Close() // idempotent
	if b.Subscribers() != 0 {
		t.Fatalf("subscribers after close %d", b.Subscribers())
	}
	// Buffered values stay readable, then the channel is closed.
	if v, ok := <-s.C(); !ok || v != 1 {
		t.Fatalf("buffered value %d %v", v, ok)
	}
	if _, ok := <-s.C(); ok {
		t.Fatal("channel not closed")
	}
	b.Publish(3) // no subscriber: no panic, nothing counted
	if b.Dropped() != 1 {
		t.Fatalf("total dropped %d, want 1 (kept after the subscriber left)", b.Dropped())
	}
	recs := lb.records(t)
	last := recs[len(recs)-1]
	if last["subscriber"] != "peer-1" || last["dropped_total"] != float64(1) {
		t.Fatalf("close log %v", last)
	}
}

func TestDropLogsAreRateLimited(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	b, lb := newTest(t, 1, time.Minute, clock)
	s := b.Subscribe("slow")
	defer s.Close()
	b.Publish(0) // fills the buffer
	for i := range 100 {
		b.Publish(i)
	}
	advance(30 * time.Second)
	b.Publish(0)
	advance(31 * time.Second)
	for range 5 {
		b.Publish(0)
	}
	recs := lb.records(t)
	type want struct{ dropped, total float64 }
	// The first drop is reported at once; the next 100 (99 in the burst and one at
	// +30s) wait for the interval and are reported with the first drop after it.
	wants := []want{{1, 1}, {101, 102}}
	if len(recs) != len(wants) {
		t.Fatalf("%d log records, want %d: %v", len(recs), len(wants), recs)
	}
	for i, w := range wants {
		r := recs[i]
		if r["dropped"] != w.dropped || r["dropped_total"] != w.total || r["subscriber"] != "slow" || r["buffer"] != float64(1) {
			t.Errorf("record %d: %v, want dropped %v total %v", i, r, w.dropped, w.total)
		}
	}
	if s.Dropped() != 106 {
		t.Errorf("dropped %d, want 106", s.Dropped())
	}
}

// Concurrent publishers and subscribers coming and going: run with -race.
func TestConcurrentUse(t *testing.T) {
	b, _ := newTest(t, 16, 0, nil)
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				b.Publish(p*1000 + i)
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				s := b.Subscribe("churn")
				drain(s)
				s.Close()
			}
		}()
	}
	wg.Wait()
	if b.Subscribers() != 0 {
		t.Fatalf("subscribers left: %d", b.Subscribers())
	}
}

// Every subscriber sees concurrent publications in the same order.
func TestSameOrderForAll(t *testing.T) {
	b, _ := newTest(t, 4000, 0, nil)
	a, c := b.Subscribe("a"), b.Subscribe("c")
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				b.Publish(p*1000 + i)
			}
		}()
	}
	wg.Wait()
	a.Close()
	c.Close()
	ga, gc := drain(a), drain(c)
	if len(ga) != 4000 || !equal(ga, gc) {
		t.Fatalf("orders differ or incomplete: %d %d", len(ga), len(gc))
	}
}

func TestBroadcasterClose(t *testing.T) {
	b, _ := newTest(t, 4, 0, nil)
	s := b.Subscribe("a")
	b.Publish(1)
	b.Close()
	if v, ok := <-s.C(); !ok || v != 1 {
		t.Fatalf("buffered value lost at Close: %d %v", v, ok)
	}
	if _, ok := <-s.C(); ok {
		t.Fatal("subscription not ended by Close")
	}
	late := b.Subscribe("late")
	if _, ok := <-late.C(); ok {
		t.Fatal("subscription after Close is open")
	}
	late.Close()
	b.Publish(2) // no subscriber left: nothing happens
	if b.Subscribers() != 0 || b.Dropped() != 0 {
		t.Fatalf("after Close: %d subscribers, %d dropped", b.Subscribers(), b.Dropped())
	}
}
