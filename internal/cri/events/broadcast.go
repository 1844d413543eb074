// Package events fans values out to any number of subscribers without ever letting a
// slow subscriber hold up the publisher: each subscriber has a bounded buffer, and what
// does not fit is dropped and counted.
package events

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBuffer is the per-subscriber buffer when Options.Buffer is zero. It matches
// the 1000-event channel containerd's CRI plugin gives its event stream: enough to
// absorb a burst of pod churn while the reader is briefly busy.
const DefaultBuffer = 1024

// DefaultLogInterval is how often, at most, drops of one subscriber are logged.
const DefaultLogInterval = 10 * time.Second

// Options configures a Broadcaster.
type Options struct {
	// Buffer is how many values one subscriber may have waiting; 0 means DefaultBuffer.
	Buffer int
	// LogInterval bounds how often a subscriber's drops are logged, so a stuck
	// subscriber cannot flood the log; 0 means DefaultLogInterval.
	LogInterval time.Duration
	// Log receives drop reports; nil means slog.Default().
	Log *slog.Logger
	// Now is the clock used for log rate limiting; nil means time.Now.
	Now func() time.Time
}

// Broadcaster delivers every published value to every current subscriber, in
// publication order. It is safe for concurrent use; the zero value is not usable:
// use New.
type Broadcaster[T any] struct {
	opts Options

	mu     sync.Mutex
	subs   map[uint64]*Subscription[T]
	nextID uint64
	closed bool
	// dropped counts drops of subscribers that have gone, so Dropped stays monotonic.
	dropped atomic.Uint64
}

// New returns a Broadcaster with no subscribers.
func New[T any](opts Options) *Broadcaster[T] {
	if opts.Buffer <= 0 {
		opts.Buffer = DefaultBuffer
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = DefaultLogInterval
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Broadcaster[T]{opts: opts, subs: map[uint64]*Subscription[T]{}}
}

// Subscription is one subscriber's view: values arrive on C until Close.
type Subscription[T any] struct {
	id   uint64
	name string
	ch   chan T
	b    *Broadcaster[T]

	dropped atomic.Uint64
	// Rate limiting of drop logs; guarded by the Broadcaster's mu, under which
	// every drop happens.
	lastLog    time.Time
	loggedDrop uint64

	closeOnce sync.Once
}

// Subscribe adds a subscriber. name identifies it in logs. The caller must Close the
// subscription when it stops reading. After Close of the Broadcaster the subscription
// comes back with C already closed.
func (b *Broadcaster[T]) Subscribe(name string) *Subscription[T] {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	s := &Subscription[T]{id: b.nextID, name: name, ch: make(chan T, b.opts.Buffer), b: b}
	if b.closed {
		s.closeOnce.Do(func() { close(s.ch) })
		return s
	}
	b.subs[s.id] = s
	return s
}

// Close ends every subscription (their C is closed once drained) and makes later
// Subscribe calls return ended subscriptions; Publish becomes a no-op.
func (b *Broadcaster[T]) Close() {
	b.mu.Lock()
	subs := make([]*Subscription[T], 0, len(b.subs))
	for _, s := range b.subs {
		subs = append(subs, s)
	}
	b.closed = true
	b.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
}

// Publish hands v to every subscriber that has room and drops it for the others. It
// never blocks on a subscriber.
func (b *Broadcaster[T]) Publish(v T) {
	var reports []dropReport
	// One exclusive lock: concurrent Publish calls are serialised, so every
	// subscriber sees the same order, and Close cannot close a channel mid-send.
	// Holding it is cheap because no send here can block.
	b.mu.Lock()
	for _, s := range b.subs {
		select {
		case s.ch <- v:
		default:
			if r, ok := s.drop(b.opts); ok {
				reports = append(reports, r)
			}
		}
	}
	b.mu.Unlock()
	// Logged outside the lock: a slow log sink must not hold up other publishers.
	for _, r := range reports {
		b.opts.Log.Warn("event subscriber too slow: buffer full, dropping events",
			"subscriber", r.name, "dropped", r.since, "dropped_total", r.total, "buffer", b.opts.Buffer)
	}
}

// Subscribers reports how many subscribers there are; publishers use it to skip
// building values nobody will read.
func (b *Broadcaster[T]) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Dropped is the number of values dropped for all subscribers, past and present.
func (b *Broadcaster[T]) Dropped() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.dropped.Load()
	for _, s := range b.subs {
		n += s.dropped.Load()
	}
	return n
}

// C is where the subscriber's values arrive. It is closed by Close.
func (s *Subscription[T]) C() <-chan T { return s.ch }

// Dropped is how many values this subscriber missed because its buffer was full.
func (s *Subscription[T]) Dropped() uint64 { return s.dropped.Load() }

// Close removes the subscriber and closes C; values still buffered stay readable.
// It is safe to call more than once.
func (s *Subscription[T]) Close() {
	s.closeOnce.Do(func() {
		b := s.b
		b.mu.Lock()
		delete(b.subs, s.id)
		b.dropped.Add(s.dropped.Load())
		close(s.ch)
		b.mu.Unlock()
		if n := s.dropped.Load(); n > 0 {
			b.opts.Log.Warn("event subscriber gone; it missed events because it read too slowly",
				"subscriber", s.name, "dropped_total", n, "buffer", b.opts.Buffer)
		}
	})
}

// dropReport is one rate-limited log line about a subscriber's drops.
type dropReport struct {
	name         string
	since, total uint64
}

// drop counts a value the subscriber had no room for and says whether to report it:
// at most once per LogInterval, with how many were lost since the last report.
func (s *Subscription[T]) drop(o Options) (dropReport, bool) {
	n := s.dropped.Add(1)
	now := o.Now()
	if !s.lastLog.IsZero() && now.Sub(s.lastLog) < o.LogInterval {
		return dropReport{}, false
	}
	r := dropReport{name: s.name, since: n - s.loggedDrop, total: n}
	s.lastLog, s.loggedDrop = now, n
	return r, true
}
