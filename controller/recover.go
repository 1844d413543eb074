package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/tasksandbox"
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
		sb := newSandbox(r)
		c.mu.Lock()
		c.sandboxes[r.ID] = sb
		c.mu.Unlock()
		if r.Phase == phaseCreating {
			c.log.Info("undoing pod creation cut short by a restart", "pod", r.ID)
			// A `shim start` and CNI plugins run by the killed criserver may still be
			// going: what they do after the undo would be left behind.
			waitShimStart(ctx, r.Bundle, r.ID, c.opts.ShimStartTimeout)
			if n := c.net.AwaitOrphanPlugins(ctx, r.ID); n > 0 {
				c.log.Info("waited for CNI plugins of the previous criserver", "pod", r.ID, "plugins", n)
			}
			if r.Address == "" {
				// The shim may have started after the last write: crisp's shim leaves
				// its address, criserver a task-only shim's start answer.
				if data, err := os.ReadFile(filepath.Join(r.Bundle, "shim.address")); err == nil {
					sb.rec.Address = strings.TrimSpace(string(data))
				} else if addr, version, ok := tasksandbox.ReadBootstrap(r.Bundle); ok {
					sb.rec.Address, sb.rec.TaskAPI = addr, version
				}
			}
			c.resumeShimLog(sb)
			if sb.rec.Address != "" {
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if c.connect(dctx, sb) == nil && sb.isTaskOnly() {
					c.settlePause(ctx, sb)
				}
				cancel()
			}
			if err := c.teardown(ctx, sb, 0, true); err != nil {
				c.log.Error("undo interrupted pod creation", "pod", r.ID, "err", err)
				ids = append(ids, r.ID)
				continue
			}
			c.forget(r.ID)
			c.opts.Metrics.PodRecovered(metrics.RecoveredUndone)
			continue
		}
		ids = append(ids, r.ID)
		if r.Address == "" {
			continue
		}
		c.resumeShimLog(sb)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.connect(dctx, sb)
		cancel()
		if err != nil {
			c.log.Warn("pod shim is gone; pod is not ready", "pod", r.ID, "err", err)
			sb.mu.Lock()
			c.markShimDeadLocked(sb, "the shim did not answer at recovery: "+err.Error())
			sb.mu.Unlock()
			c.opts.Metrics.PodRecovered(metrics.RecoveredShimDead)
			continue
		}
		if r.Phase == phaseReady {
			c.watch(sb)
		}
		if sb.isTaskOnly() {
			c.recoverTaskIO(ctx, sb)
		}
		c.log.Info("reconnected to pod shim", "pod", r.ID, "address", r.Address)
		c.opts.Metrics.PodRecovered(metrics.RecoveredReconnected)
	}
	// Before the sweep of sockets: a spare's shim still answers on its own.
	if err := c.recoverSpares(ctx); err != nil {
		return nil, err
	}
	c.removeStraySockets()
	c.awaitReapers(ctx)
	c.startSpareKeepers()
	return ids, nil
}

// awaitReapers waits until the pods of the shims recovery found dead have been
// killed, so that nothing is served about a pod whose processes may still run.
func (c *Controller) awaitReapers(ctx context.Context) {
	c.mu.Lock()
	var reaping []*sandbox
	for _, sb := range c.sandboxes {
		sb.mu.Lock()
		if sb.reaping {
			reaping = append(reaping, sb)
		}
		sb.mu.Unlock()
	}
	c.mu.Unlock()
	for _, sb := range reaping {
		select {
		case <-sb.reaped:
		case <-ctx.Done():
			return
		}
	}
}

// removeStraySockets removes sockets in crisp's shim socket dir that no known pod
// uses and nobody listens on: left by a shim start or a shim that was killed between
// binding its socket and recording it. Nothing else can be starting a shim while
// Recover runs.
func (c *Controller) removeStraySockets() {
	dir := c.opts.socketDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	known := map[string]bool{}
	c.mu.Lock()
	for _, sb := range c.sandboxes {
		sb.mu.Lock()
		if sb.rec.Address != "" {
			known[trimUnix(sb.rec.Address)] = true
		}
		sb.mu.Unlock()
	}
	c.mu.Unlock()
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if known[path] || e.Type()&os.ModeSocket == 0 {
			continue
		}
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = conn.Close()
			continue
		}
		if err := os.Remove(path); err == nil {
			c.log.Info("removed stray shim socket", "path", path)
		}
	}
}

// waitShimStart waits, up to limit, for a `shim start` of pod id to finish. crisp's
// shim holds an flock on the bundle directory while it starts, but a start exec'd just
// before criserver died may not have taken it yet (Go's runtime start alone is ~15 ms),
// so the processes are looked for as well. Tearing the pod down before start is done
// would miss the socket and the shim that start is about to leave behind.
func waitShimStart(ctx context.Context, bundle, id string, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for (bundleLocked(bundle) || shimStartRunning(id)) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// bundleLocked reports whether a shim start holds the bundle's flock.
func bundleLocked(bundle string) bool {
	d, err := os.Open(bundle)
	if err != nil {
		return false
	}
	defer d.Close()
	err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
		return false
	}
	return errors.Is(err, syscall.EWOULDBLOCK)
}

// shimStartRunning reports whether a `<shim> ... -id id ... start` process is alive,
// judged by the command line shimCall.args gives it.
func shimStartRunning(id string) bool {
	found := false
	eachProcess(func(pid int, args []string) bool {
		found = len(args) > 2 && args[len(args)-1] == "start" && hasArg(args, "-id", id) && processAlive(pid)
		return found
	})
	return found
}

// findShim finds the running shim of pod id whose pid criserver does not know (a
// task-only shim writes no pid file, and a crash may come before Connect told it; a
// `start` killed between forking the serving shim and writing shim.pid leaves it
// unrecorded, whatever the shim): the process with `-id id` on its command line, no start or delete action, working
// in the pod's bundle, as runtime-v2 shims run.
func findShim(bundle, id string) int {
	shim := 0
	eachProcess(func(pid int, args []string) bool {
		if !hasArg(args, "-id", id) || args[len(args)-1] == "start" || args[len(args)-1] == "delete" {
			return false
		}
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != bundle || !processAlive(pid) {
			return false
		}
		shim = pid
		return true
	})
	return shim
}

// eachProcess calls fn with the pid and command line of every process but criserver
// until fn returns true.
func eachProcess(fn func(pid int, args []string) bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(data) == 0 {
			continue
		}
		if fn(pid, strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")) {
			return
		}
	}
}

// hasArg reports whether args holds flag followed by value.
func hasArg(args []string, flag, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}
