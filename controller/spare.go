package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/ttrpc"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/tasksandbox"
)

// A warm spare is a shim started, exactly as Create would start it for a pod, before
// any pod asks for it: `shim start` with a pre-generated pod id and the bundle dir of
// that id, then connected. NewSandboxID hands the id out to the next RunPodSandbox of
// the handler, and Create then skips the shim's fork/exec, runtime start and socket
// handshake. The shim cannot tell a spare from a pod's shim: nothing in it changes.
//
// Bounds: per handler, at most one spare waits (ready); ids handed out and not yet
// created (offered) belong to calls in flight and are retired if their Create does not
// come within spareOfferTimeout.
const (
	// spareBucket holds a record per spare from before its shim starts until it is
	// adopted (in the same transaction as the pod's record) or gone, so that a restart
	// finds the spares the killed criserver left.
	spareBucket = "spares"
	// SpareMarker is a file in a spare's bundle dir while it is a spare: it tells
	// people and tests which shim is a spare.
	SpareMarker = "spare"
	// spareOfferTimeout bounds how long an id handed out by NewSandboxID keeps its
	// spare for the Create that should follow (RunPodSandbox failed in between
	// otherwise: a name conflict, an invalid config). The CRI asks for the id
	// microseconds before it creates the pod; a Create later than this still works,
	// with a shim of its own. It is no longer than spareRefillHold, so that an unused
	// offer is gone before its replacement starts: one idle shim per handler.
	spareOfferTimeout = 2 * time.Second
	// spareRefillHold is how long, at most, the replacement of an adopted spare waits
	// for the adopting pod start to finish, so that the two do not compete for the CPU.
	spareRefillHold = 2 * time.Second
	// spareRefillDelay is how long after that the replacement starts: kubelet creates
	// and starts the pod's containers right after RunPodSandbox, and a shim starting
	// next to them (fork/exec, the Go runtime's start) made CreateContainer slower on a
	// two-core node (p50 +6..12 ms in make bench), while the next pod start rarely
	// comes sooner.
	spareRefillDelay = 100 * time.Millisecond
	// spareRetryFloor and spareRetryMax bound the backoff after a spare failed to start.
	spareRetryFloor = time.Second
	spareRetryMax   = time.Minute
	// spareRetireTimeout bounds shutting one spare down.
	spareRetireTimeout = 10 * time.Second
)

// phaseSpare is the in-memory phase of a spare's sandbox until a Create adopts it.
const phaseSpare = "spare"

// spareRecord is the persisted part of a spare.
type spareRecord struct {
	ID        string    `json:"id"`
	Handler   string    `json:"handler"`
	Shim      string    `json:"shim"`
	Namespace string    `json:"namespace"`
	Bundle    string    `json:"bundle"`
	CreatedAt time.Time `json:"created_at"`
	Mode      string    `json:"mode,omitempty"`
}

// spare is a started and connected shim no pod uses yet.
type spare struct {
	sb      *sandbox
	handler string
}

// spareSet is the controller's warm spares. Its keepers (one goroutine per handler with
// warm_spare on) are the only ones that start spares; they are started by Recover and
// stopped by Close.
type spareSet struct {
	// kick wakes the keeper of a handler (buffer 1). Built by New, never changed.
	kick map[string]chan struct{}

	mu sync.Mutex
	// ready is the spare waiting for a handler's next pod.
	ready map[string]*spare
	// offered are the spares whose id NewSandboxID handed out, by id, with when.
	offered   map[string]*spare
	offeredAt map[string]time.Time
	// adopting counts, per handler, Creates that adopted a spare and are running;
	// lastOffer is when the handler's spare was last handed out. Together they hold
	// the refill back while the pod start that took the spare runs.
	adopting  map[string]int
	lastOffer map[string]time.Time
	// refillAt is when the replacement of a handler's adopted spare may start.
	refillAt map[string]time.Time
	// retiring are expired offers being shut down: a late Create of the id waits for
	// the channel, closed when the shim is gone, before it starts a shim of its own.
	retiring map[string]chan struct{}
	started  bool
	wg       sync.WaitGroup
}

func newSpareSet(runtimes map[string]config.Runtime) *spareSet {
	s := &spareSet{kick: map[string]chan struct{}{}, ready: map[string]*spare{}, offered: map[string]*spare{},
		offeredAt: map[string]time.Time{}, adopting: map[string]int{}, lastOffer: map[string]time.Time{}, refillAt: map[string]time.Time{},
		retiring: map[string]chan struct{}{}}
	for name, rt := range runtimes {
		if rt.WarmSpare {
			s.kick[name] = make(chan struct{}, 1)
		}
	}
	return s
}

// wake asks the keeper of handler to look at its spare again; it never blocks.
func (s *spareSet) wake(handler string) {
	if ch := s.kick[handler]; ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// NewID returns a fresh random pod id (64 hex digits, as the CRI's own ids).
func NewID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewSandboxID returns the id the next pod of handler should have: the id of the
// handler's ready warm spare, handed to this caller alone, or else a fresh random one.
// Create with that id adopts the spare.
func (c *Controller) NewSandboxID(handler string) string {
	s := c.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.ready[handler]
	if sp == nil {
		return NewID()
	}
	delete(s.ready, handler)
	sp.sb.mu.Lock()
	dead := sp.sb.shimDead
	sp.sb.mu.Unlock()
	if dead {
		// Its keeper retires it; this pod gets a shim of its own.
		s.ready[handler] = sp
		s.wake(handler)
		return NewID()
	}
	id := sp.sb.rec.ID
	now := time.Now()
	s.offered[id], s.offeredAt[id], s.lastOffer[handler] = sp, now, now
	// The keeper times the offer out, and the refill.
	s.wake(handler)
	return id
}

// claimSpare takes the spare offered under id for a Create of handler: nil when there
// is none (the pod starts its own shim). A spare that died or belongs to another
// handler is shut down first, so that the pod's own shim can use the id. It fails only
// when ctx ends while an expired offer of the id is still being shut down.
func (c *Controller) claimSpare(ctx context.Context, id, handler string) (*spare, error) {
	s := c.spares
	s.mu.Lock()
	for {
		ch := s.retiring[id]
		if ch == nil {
			break
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			// Starting a shim under the id now would race the shutdown.
			return nil, fmt.Errorf("wait for the unused warm spare of pod %s to shut down: %w", id, ctx.Err())
		}
		s.mu.Lock()
	}
	sp := s.offered[id]
	delete(s.offered, id)
	delete(s.offeredAt, id)
	if sp != nil && sp.handler == handler {
		s.adopting[handler]++
	}
	s.mu.Unlock()
	if sp == nil {
		return nil, nil
	}
	if alive := c.spareAlive(sp); sp.handler != handler || !alive {
		c.log.Info("not adopting warm spare shim", "pod", id, "spare_handler", sp.handler, "handler", handler, "alive", alive)
		if sp.handler == handler {
			c.adopted(handler)
		}
		c.retireSpare(sp.sb)
		c.spares.wake(sp.handler)
		return nil, nil
	}
	return sp, nil
}

// adopted ends the adoption of a spare of handler by a Create, which succeeded or
// failed: the keeper may start the replacement now.
func (c *Controller) adopted(handler string) {
	s := c.spares
	s.mu.Lock()
	s.adopting[handler]--
	s.refillAt[handler] = time.Now().Add(spareRefillDelay)
	s.mu.Unlock()
	s.wake(handler)
}

// startSpareKeepers starts one keeper per handler with warm_spare on; only the first
// call does anything.
func (c *Controller) startSpareKeepers() {
	s := c.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || c.bg.Err() != nil {
		return
	}
	s.started = true
	for name := range s.kick {
		s.wg.Add(1)
		go c.keepSpare(name, c.opts.Runtimes[name])
	}
}

// keepSpare keeps one ready spare for handler until the controller closes: it starts
// one when there is none (after the pod start that took the last one, or after a
// backoff when starting failed), replaces one whose shim died, and retires offers
// whose Create never came.
func (c *Controller) keepSpare(handler string, rt config.Runtime) {
	s := c.spares
	defer s.wg.Done()
	var retryAt time.Time
	backoff := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		wakeAt := now.Add(time.Hour)
		// Offers whose Create never came.
		var expired []*spare
		s.mu.Lock()
		for id, sp := range s.offered {
			if sp.handler != handler {
				continue
			}
			if at := s.offeredAt[id].Add(spareOfferTimeout); now.Before(at) {
				wakeAt = earliest(wakeAt, at)
				continue
			}
			delete(s.offered, id)
			delete(s.offeredAt, id)
			s.retiring[id] = make(chan struct{})
			expired = append(expired, sp)
		}
		cur := s.ready[handler]
		hold := false
		if s.adopting[handler] > 0 || c.offersOfLocked(handler) > 0 {
			if until := s.lastOffer[handler].Add(spareRefillHold); now.Before(until) {
				hold = true
				wakeAt = earliest(wakeAt, until)
			}
		}
		if at := s.refillAt[handler]; now.Before(at) {
			hold = true
			wakeAt = earliest(wakeAt, at)
		}
		s.mu.Unlock()
		for _, sp := range expired {
			c.log.Info("warm spare shim handed out but never used; shutting it down", "handler", handler, "pod", sp.sb.rec.ID)
			c.retireSpare(sp.sb)
			s.mu.Lock()
			close(s.retiring[sp.sb.rec.ID])
			delete(s.retiring, sp.sb.rec.ID)
			s.mu.Unlock()
		}
		if cur != nil && !c.spareAlive(cur) {
			s.mu.Lock()
			if s.ready[handler] == cur {
				delete(s.ready, handler)
			}
			s.mu.Unlock()
			c.log.Warn("warm spare shim died; replacing it", "handler", handler, "pod", cur.sb.rec.ID)
			c.retireSpare(cur.sb)
			cur = nil
		}
		if cur == nil && !hold {
			if now.Before(retryAt) {
				wakeAt = earliest(wakeAt, retryAt)
			} else if c.bg.Err() == nil {
				if err := c.startSpare(handler, rt); err != nil {
					backoff = min(max(2*backoff, spareRetryFloor), spareRetryMax)
					retryAt = time.Now().Add(backoff)
					c.log.Warn("start warm spare shim", "handler", handler, "retry_in", backoff, "err", err)
				} else {
					backoff, retryAt = 0, time.Time{}
				}
				continue
			}
		}
		timer.Reset(time.Until(wakeAt))
		select {
		case <-c.bg.Done():
			return
		case <-s.kick[handler]:
		case <-timer.C:
		}
		// Since Go 1.23 a stopped timer delivers nothing stale after the Reset above.
		timer.Stop()
	}
}

// offersOfLocked counts the ids of handler's spares handed out and not yet created;
// c.spares.mu must be held.
func (c *Controller) offersOfLocked(handler string) int {
	n := 0
	for _, sp := range c.spares.offered {
		if sp.handler == handler {
			n++
		}
	}
	return n
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// spareAlive reports whether the shim of sp still runs and its connection is up.
func (c *Controller) spareAlive(sp *spare) bool {
	sp.sb.mu.Lock()
	dead, pid := sp.sb.shimDead, sp.sb.shimPid
	sp.sb.mu.Unlock()
	return !dead && processAlive(pid)
}

// startSpare starts and connects a spare for handler and makes it the handler's ready
// spare. On failure nothing of it is left.
func (c *Controller) startSpare(handler string, rt config.Runtime) error {
	shimBin, err := ResolveShim(rt.Shim)
	if err != nil {
		return fmt.Errorf("runtime handler %q: %w", handler, err)
	}
	ns := rt.Namespace
	if ns == "" {
		ns = "k8s.io"
	}
	id := NewID()
	mode := rt.Mode()
	sb := newSandbox(record{
		ID:        id,
		Phase:     phaseSpare,
		Handler:   handler,
		Shim:      shimBin,
		Namespace: ns,
		Bundle:    filepath.Join(c.opts.bundleRoot(), id),
		CreatedAt: time.Now(),
		Mode:      mode,
	})
	t0 := time.Now()
	if err := c.store.Put(spareBucket, id, spareRecord{ID: id, Handler: handler, Shim: shimBin, Namespace: ns,
		Bundle: sb.rec.Bundle, CreatedAt: sb.rec.CreatedAt, Mode: mode}); err != nil {
		return fmt.Errorf("record warm spare: %w", err)
	}
	fail := func(err error) error {
		c.retireSpare(sb)
		return err
	}
	if err := os.MkdirAll(sb.rec.Bundle, 0o711); err != nil {
		return fail(fmt.Errorf("create bundle of warm spare %s: %w", id, err))
	}
	if err := os.WriteFile(filepath.Join(sb.rec.Bundle, SpareMarker), []byte(handler+"\n"), 0o600); err != nil {
		return fail(fmt.Errorf("mark warm spare %s: %w", id, err))
	}
	if sb.isTaskOnly() {
		l, err := c.tasks.PrepareSpare(c.taskPod(sb))
		if err != nil {
			return fail(err)
		}
		sb.setShimLog(l)
	}
	ctx, cancel := context.WithTimeout(c.bg, c.opts.ShimStartTimeout)
	defer cancel()
	addr, version, err := c.startShimProcess(ctx, &sb.rec)
	if err != nil {
		return fail(fmt.Errorf("start shim of warm spare %s: %w", id, err))
	}
	sb.rec.Address, sb.rec.TaskAPI = addr, version
	if err := c.connect(ctx, sb); err != nil {
		return fail(fmt.Errorf("connect to shim of warm spare %s: %w", id, err))
	}
	s := c.spares
	s.mu.Lock()
	if c.bg.Err() != nil {
		// Close is waiting for this keeper: it would not see the spare.
		s.mu.Unlock()
		return fail(c.bg.Err())
	}
	s.ready[handler] = &spare{sb: sb, handler: handler}
	s.mu.Unlock()
	c.log.Debug("warm spare shim ready", "handler", handler, "pod", id, "pid", sb.shimPid, "took", time.Since(t0))
	return nil
}

// retireSpare shuts a spare's shim down and removes everything of it: socket, bundle
// and record. The shim has no sandbox or task, so killing it loses nothing when it
// does not answer.
func (c *Controller) retireSpare(sb *sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), spareRetireTimeout)
	defer cancel()
	sb.mu.Lock()
	client, svc, pid, cancelWatch := sb.client, sb.svc, sb.shimPid, sb.cancel
	sb.client = nil
	id, bundle, addr := sb.rec.ID, sb.rec.Bundle, sb.rec.Address
	sb.mu.Unlock()
	if cancelWatch != nil {
		cancelWatch()
	}
	if pid == 0 {
		pid = readShimPid(bundle)
	}
	if !isShimOf(pid, id) {
		// Never signal a pid the kernel may have handed to someone else.
		pid = 0
	}
	if addr == "" {
		if data, err := os.ReadFile(filepath.Join(bundle, "shim.address")); err == nil {
			addr = strings.TrimSpace(string(data))
		} else if a, _, ok := tasksandbox.ReadBootstrap(bundle); ok {
			addr = a
		}
	}
	if pid == 0 {
		// As in teardown: a start killed before it recorded the shim it forked.
		pid = findShim(bundle, id)
	}
	if svc != nil {
		if _, err := svc.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: id}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
			c.log.Debug("shut down warm spare shim", "pod", id, "err", err)
		}
	} else if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if client != nil {
		_ = client.Close()
	}
	if pid > 0 && !waitGone(pid, 5*time.Second) {
		c.log.Warn("warm spare shim did not exit after shutdown; killing it", "pod", id, "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 2*time.Second)
	}
	sb.closeShimLog()
	if addr != "" {
		_ = os.Remove(trimUnix(addr))
	} else if sb.isTaskOnly() {
		c.tasks.RemoveShimSockets(c.taskPod(sb))
	}
	if err := os.RemoveAll(bundle); err != nil {
		c.log.Error("remove bundle of warm spare shim", "pod", id, "err", err)
		return
	}
	if err := c.store.Delete(spareBucket, id); err != nil {
		c.log.Error("drop record of warm spare shim", "pod", id, "err", err)
	}
}

// closeSpares stops the keepers and retires every spare, ready or handed out and not
// created: a criserver that stops leaves no idle shim behind.
func (c *Controller) closeSpares() {
	s := c.spares
	s.wg.Wait()
	s.mu.Lock()
	var all []*spare
	for h, sp := range s.ready {
		all = append(all, sp)
		delete(s.ready, h)
	}
	for id, sp := range s.offered {
		all = append(all, sp)
		delete(s.offered, id)
		delete(s.offeredAt, id)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, sp := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.retireSpare(sp.sb)
		}()
	}
	wg.Wait()
}

// recoverSpares shuts down the spares a previous criserver left (it was killed): their
// shims, sockets and bundles. A spare adopted before the kill has a pod record instead
// (the two are swapped in one transaction) and is left to Recover.
func (c *Controller) recoverSpares(ctx context.Context) error {
	var recs []spareRecord
	err := c.store.ForEach(spareBucket, func(_ string, data []byte) error {
		var r spareRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("decode warm spare record: %w", err)
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load warm spares: %w", err)
	}
	for _, r := range recs {
		if c.get(r.ID) != nil {
			if err := c.store.Delete(spareBucket, r.ID); err != nil {
				return err
			}
			continue
		}
		// A `shim start` of the killed criserver may still be going: its shim would
		// be left behind.
		waitShimStart(ctx, r.Bundle, r.ID, c.opts.ShimStartTimeout)
		sb := newSandbox(record{ID: r.ID, Phase: phaseSpare, Handler: r.Handler, Shim: r.Shim, Namespace: r.Namespace, Bundle: r.Bundle, Mode: r.Mode})
		c.retireSpare(sb)
		c.log.Info("removed warm spare shim of the previous run", "handler", r.Handler, "pod", r.ID)
	}
	return nil
}
