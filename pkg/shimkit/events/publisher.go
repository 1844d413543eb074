package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

const (
	// eventsService and forwardMethod name containerd's ttrpc Events.Forward
	// (services/ttrpc/events/v1/events.proto), what containerd's shims publish with.
	eventsService = "containerd.services.events.ttrpc.v1.Events"
	forwardMethod = "Forward"
	// namespaceHeader carries the namespace in ttrpc metadata, as containerd's
	// namespaces.WithNamespace sets it (pkg/namespaces/ttrpc.go).
	namespaceHeader = "containerd-namespace-ttrpc"

	// DefaultQueueSize bounds the events waiting to be sent. A shim that cannot reach
	// its caller drops the newest events past it rather than grow or block.
	DefaultQueueSize = 128
	// maxAttempts bounds the tries per event (containerd's shims requeue 5 times).
	maxAttempts = 5
	// firstBackoff doubles after every failed try, up to maxBackoff.
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 2 * time.Second
	dialTimeout  = 2 * time.Second
	// callTimeout is containerd's own for a forwarded event.
	callTimeout = 5 * time.Second
)

// Config says where a Publisher sends events.
type Config struct {
	// Address is the caller's ttrpc socket: containerd's TTRPC_ADDRESS (a path, or
	// "unix://" and a path). Empty means nobody listens: Start returns nil.
	Address string
	// Namespace goes in every envelope and in the ttrpc namespace header.
	Namespace string
	Logger    *slog.Logger
	// QueueSize is DefaultQueueSize when 0.
	QueueSize int
}

// Publisher sends task events, in order, from one goroutine that Start starts and
// Close stops. A nil *Publisher publishes nothing, so callers need no checks.
type Publisher struct {
	addr, namespace string
	log             *slog.Logger

	// mu guards closed against Publish racing Close's close(queue).
	mu     sync.RWMutex
	closed bool
	queue  chan item

	cancel  context.CancelFunc
	done    chan struct{} // closed when the sending goroutine has returned
	dropped atomic.Uint64

	// client is owned by the sending goroutine.
	client *ttrpc.Client
}

type item struct {
	topic string
	req   []byte // encoded ForwardRequest
}

// Start returns a Publisher sending to cfg.Address, or nil when there is no address.
func Start(cfg Config) *Publisher {
	if cfg.Address == "" {
		return nil
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	size := cfg.QueueSize
	if size <= 0 {
		size = DefaultQueueSize
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		addr:      strings.TrimPrefix(cfg.Address, "unix://"),
		namespace: cfg.Namespace,
		log:       log.With("events", cfg.Address),
		queue:     make(chan item, size),
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	go p.run(ctx)
	return p
}

// Publish queues e and returns at once: a task operation never waits for the caller's
// event service. When the queue is full (the caller has been unreachable for a while)
// the event is dropped and logged; Wait and State still tell the truth.
func (p *Publisher) Publish(e Event) {
	if p == nil {
		return
	}
	it := item{topic: e.Topic(), req: forwardRequest(time.Now(), p.namespace, e)}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return
	}
	select {
	case p.queue <- it:
	default:
		if n := p.dropped.Add(1); n&(n-1) == 0 { // 1, 2, 4, 8, …: logs stay bounded
			p.log.Warn("event queue full, dropping event", "topic", it.topic, "dropped", n)
		}
	}
}

// Close stops taking events and sends what is queued until ctx ends; then it abandons
// the rest. It returns once the sending goroutine has exited.
func (p *Publisher) Close(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.queue)
	}
	p.mu.Unlock()
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		err = fmt.Errorf("events not sent before shutdown: %d: %w", len(p.queue), ctx.Err())
		p.cancel()
		<-p.done
	}
	p.cancel()
	return err
}

func (p *Publisher) run(ctx context.Context) {
	defer close(p.done)
	defer func() {
		if p.client != nil {
			_ = p.client.Close()
		}
	}()
	for it := range p.queue {
		if ctx.Err() != nil {
			continue // drain without sending: Close gave up
		}
		p.deliver(ctx, it)
	}
}

// deliver tries an event maxAttempts times with exponential backoff, then drops it.
// Retrying in place keeps events in order: /tasks/exit must not overtake its create.
func (p *Publisher) deliver(ctx context.Context, it item) {
	backoff := firstBackoff
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if err = p.forward(ctx, it.req); err == nil {
			return
		}
		if attempt == maxAttempts {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
	p.log.Warn("dropping event after retries", "topic", it.topic, "attempts", maxAttempts, "error", err)
}

func (p *Publisher) forward(ctx context.Context, req []byte) error {
	if p.client == nil {
		d := net.Dialer{Timeout: dialTimeout}
		conn, err := d.DialContext(ctx, "unix", p.addr)
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		p.client = ttrpc.NewClient(conn)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cctx = ttrpc.WithMetadata(cctx, ttrpc.MD{namespaceHeader: []string{p.namespace}})
	err := p.client.Call(cctx, eventsService, forwardMethod, rawMessage(req), &emptypb.Empty{})
	if err != nil && !errors.Is(err, context.Canceled) {
		// Whatever went wrong (server gone, a wedged connection), the next try
		// starts from a fresh connection.
		_ = p.client.Close()
		p.client = nil
	}
	return err
}

// rawMessage carries bytes that are already a protobuf encoding through ttrpc's codec,
// which marshals proto.Messages: an Empty whose unknown fields are the payload
// marshals to exactly those bytes.
func rawMessage(b []byte) *emptypb.Empty {
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(b)
	return m
}
