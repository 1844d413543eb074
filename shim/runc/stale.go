package runc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// CleanupDead kills and removes every container recorded under root, the libcontainer
// state root of a shim that is gone: `shim-runc delete` runs it so that a dead shim's
// containers die with it instead of running on untracked (kubelet would start a second
// copy of each). For each container: every process of its cgroup killed, its cgroup
// leaves and state removed, its rootfs unmounted. Running it twice is harmless.
func CleanupDead(root string, log *slog.Logger) error {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read container states: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !task.ValidID(e.Name()) {
			continue
		}
		if err := destroyContainer(root, e.Name(), "", true, true, log); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// destroyContainer kills and destroys container id under root: every process of its
// cgroup killed, its cgroup leaves and libcontainer state removed; then rootfsDir, if
// set, is unmounted and removed, and with rootfsFromState the rootfs its state records is
// unmounted. stale says no live shim tracks the container (an earlier shim's, logged as
// such). A state dir libcontainer cannot load (a shim killed in the middle of a create
// leaves one without state.json) is removed: nothing was recorded in it, so nothing can
// run from it. Every step tolerates having been done, so it can be repeated.
func destroyContainer(root, id, rootfsDir string, rootfsFromState, stale bool, log *slog.Logger) error {
	if err := destroyState(root, id, rootfsFromState, stale, log); err != nil {
		return err
	}
	if rootfsDir != "" {
		if err := mount.Unmount(rootfsDir); err != nil {
			return fmt.Errorf("container %s: %w", id, err)
		}
		if err := os.Remove(rootfsDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("container %s: remove rootfs dir: %w", id, err)
		}
	}
	return nil
}

func destroyState(root, id string, rootfsFromState, stale bool, log *slog.Logger) error {
	dir := filepath.Join(root, id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lc, err := libcontainer.Load(root, id)
	if err != nil {
		log.Warn("removing unusable container state", "container", id, "dir", dir, "error", err)
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove stale state of container %s: %w", id, err)
		}
		return nil
	}
	if stale {
		log.Warn("destroying container left by a dead shim", "container", id)
	}
	if err := killStale(lc); err != nil {
		return err
	}
	rootfs := lc.Config().Rootfs
	if err := destroyLibcontainer(lc); err != nil {
		return err
	}
	if rootfsFromState && rootfs != "" {
		if err := mount.Unmount(rootfs); err != nil {
			return fmt.Errorf("container %s: %w", id, err)
		}
	}
	return nil
}

// staleKillTimeout bounds the wait for a stale container's SIGKILLed processes (D
// state never ends), as the task service bounds a live one's.
const staleKillTimeout = 10 * time.Second

// killStale kills every process of lc's cgroup and waits until libcontainer reports it
// stopped. The cgroup is frozen while its pids are read and signalled, so that none can
// exit and have its pid reused by an unrelated process in between.
func killStale(lc *libcontainer.Container) error {
	frozen := lc.Pause() == nil
	// The init first: it is the one libcontainer judges the container by, and with a
	// private PID namespace its death takes every other process along.
	_ = lc.Signal(unix.SIGKILL)
	if pids, err := lc.Processes(); err == nil {
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if frozen {
		_ = lc.Resume()
	}
	deadline := time.Now().Add(staleKillTimeout)
	for {
		st, err := lc.Status()
		if err != nil || st == libcontainer.Stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stale container %s still running %s after SIGKILL", lc.ID(), staleKillTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
