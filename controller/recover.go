package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Recover loads every sandbox record and reconnects to its shim. A sandbox whose
// creation was cut short by a crash is undone completely; one whose shim is gone is
// kept as not ready so that it can still be stopped and removed. It returns the ids of
// the sandboxes that remain.
func (c *Controller) Recover(ctx context.Context) ([]string, error) {
	var recs []record
	err := c.store.ForEach(bucket, func(_ string, data []byte) error {
		var r record
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("decode sandbox record: %w", err)
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load sandboxes: %w", err)
	}
	var ids []string
	for _, r := range recs {
		sb := &sandbox{rec: r}
		c.mu.Lock()
		c.sandboxes[r.ID] = sb
		c.mu.Unlock()
		if r.Phase == phaseCreating {
			c.log.Info("undoing pod creation cut short by a restart", "pod", r.ID)
			// A `shim start` run by the killed criserver may still be going.
			waitShimStart(ctx, r.Bundle, c.opts.ShimStartTimeout)
			if r.Address == "" {
				// The shim may have started after the last write: it left its address.
				if data, err := os.ReadFile(filepath.Join(r.Bundle, "shim.address")); err == nil {
					sb.rec.Address = strings.TrimSpace(string(data))
				}
			}
			if sb.rec.Address != "" {
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = c.connect(dctx, sb)
				cancel()
			}
			if err := c.teardown(ctx, sb, 0, true); err != nil {
				c.log.Error("undo interrupted pod creation", "pod", r.ID, "err", err)
				ids = append(ids, r.ID)
				continue
			}
			c.forget(r.ID)
			continue
		}
		ids = append(ids, r.ID)
		if r.Address == "" {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.connect(dctx, sb)
		cancel()
		if err != nil {
			c.log.Warn("pod shim is gone; pod is not ready", "pod", r.ID, "err", err)
			sb.mu.Lock()
			sb.shimDead = true
			sb.mu.Unlock()
			continue
		}
		if r.Phase == phaseReady {
			c.watch(sb)
		}
		c.log.Info("reconnected to pod shim", "pod", r.ID, "address", r.Address)
	}
	return ids, nil
}

// waitShimStart waits, up to limit, for a `shim start` running on bundle to finish:
// crisp's shim holds an flock on the bundle directory while it starts. Tearing the pod
// down before would miss the shim that start is about to leave serving.
func waitShimStart(ctx context.Context, bundle string, limit time.Duration) {
	d, err := os.Open(bundle)
	if err != nil {
		return
	}
	defer d.Close()
	deadline := time.Now().Add(limit)
	for {
		err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
			return
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
