package snapshot

import (
	"context"
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"go.opentelemetry.io/otel/attribute"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Claim is the right to produce one layer snapshot: while it is held, nobody else
// unpacks the same chain ID (a layer shared by images being pulled together is unpacked
// once), and from its Commit until Release, Remove refuses the parent it is committed on.
type Claim struct {
	s       *Snapshotter
	chainID digest.Digest
	fl      *flight
	once    sync.Once
}

// flight is a claim in the snapshotter's table; others wanting the same chain ID wait
// for done. parent is set (under s.mu) once the claim's parent is known, from then on
// Remove refuses it.
type flight struct {
	parent digest.Digest
	done   chan struct{}
	// abandoned is the error the claim was given up with, for those waiting for it;
	// set before done is closed.
	abandoned error
}

// Claim registers that the caller will produce snapshot chainID. If the snapshot exists
// it returns (nil, its Info, nil): there is nothing to do. If another claim on chainID
// is outstanding it waits for that claim's Release (or ctx), then looks again, so the
// next claimer tries itself when the first one failed. A non-nil Claim must be
// released, after Commit or on failure.
func (s *Snapshotter) Claim(ctx context.Context, chainID digest.Digest) (*Claim, Info, error) {
	if err := chainID.Validate(); err != nil {
		return nil, Info{}, fmt.Errorf("claim snapshot %q: %v: %w", chainID, err, errdefs.ErrInvalidArgument)
	}
	c, info, err := s.claim(ctx, chainID, "")
	if err != nil {
		return nil, Info{}, fmt.Errorf("claim snapshot %s: %w", chainID, err)
	}
	return c, info, nil
}

// claim is Claim that also pins parent, when not empty, from the start (Remove refuses
// it until Release): Apply knows its parent before it unpacks, and fails early when it
// is missing (errdefs.ErrNotFound).
func (s *Snapshotter) claim(ctx context.Context, chainID, parent digest.Digest) (*Claim, Info, error) {
	for {
		s.mu.Lock()
		if other, ok := s.applying[chainID]; ok {
			s.mu.Unlock()
			if err := waitClaim(ctx, chainID, other); err != nil {
				return nil, Info{}, err
			}
			continue
		}
		var rec layerRecord
		err := s.get(layerBucket, chainID.String(), &rec)
		if err == nil {
			s.mu.Unlock()
			return nil, s.info(chainID, rec), nil
		}
		if !errdefs.IsNotFound(err) {
			s.mu.Unlock()
			return nil, Info{}, err
		}
		if parent != "" {
			if _, err := s.chainLocked(parent); err != nil {
				s.mu.Unlock()
				return nil, Info{}, fmt.Errorf("parent: %w", err)
			}
		}
		fl := &flight{parent: parent, done: make(chan struct{})}
		s.applying[chainID] = fl
		s.mu.Unlock()
		return &Claim{s: s, chainID: chainID, fl: fl}, Info{}, nil
	}
}

// waitClaim waits for another claim on chainID to end. The other pull's unpack is in
// its own trace: the wait is span image.pull.wait of this caller's.
func waitClaim(ctx context.Context, chainID digest.Digest, other *flight) (err error) {
	_, span := tracing.Start(ctx, "image.pull.wait")
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("crisp.image.wait.for", "unpack"),
			attribute.String("crisp.image.layer.chain_id", chainID.String()))
	}
	select {
	case <-other.done:
		if other.abandoned != nil {
			return fmt.Errorf("another pull of the same layer failed: %w", other.abandoned)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for another unpack of %s: %w", chainID, ctx.Err())
	}
}

// Abandon makes those waiting for the claim fail with err when it is released,
// instead of trying themselves: for a failure that would repeat for them (a registry
// that stopped sending).
func (c *Claim) Abandon(err error) {
	if c == nil {
		return
	}
	c.s.mu.Lock()
	if c.heldLocked() {
		c.fl.abandoned = err
	}
	c.s.mu.Unlock()
}

// Release ends the claim and wakes whoever waits for it. It is idempotent, and a no-op
// on a nil Claim, so that it can be deferred right after Claim.
func (c *Claim) Release() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		c.s.mu.Lock()
		if c.s.applying[c.chainID] == c.fl {
			delete(c.s.applying, c.chainID)
		}
		c.s.mu.Unlock()
		close(c.fl.done)
	})
}

// heldLocked tells whether c is still outstanding; s.mu must be held.
func (c *Claim) heldLocked() bool {
	return c.s.applying[c.chainID] == c.fl
}
