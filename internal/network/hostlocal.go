package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// A plugin killed half-way (the CNI timeout, a caller that gave up, recovery ending a
// dead criserver's plugin, the OOM killer) can leave what no DEL finds, because DEL
// finds by container id. host-local is the plugin that does: it creates the file of
// an address (O_EXCL, the reservation) and only then writes the owner into it; killed
// in between, the address stays reserved by an empty file for ever. An undo of a pod
// creation therefore ends with releaseUnowned for the host-local stores it touched.

// hostLocalDefaultDataDir is where host-local keeps its stores when the config names
// no dataDir.
const hostLocalDefaultDataDir = "/var/lib/cni/networks"

// hostLocalLockPoll is how often the host-local store's lock is tried.
const hostLocalLockPoll = 10 * time.Millisecond

// hostLocalStores returns the directories of the host-local stores the list's
// plugins reserve addresses in: dataDir/<network name>, as host-local names them.
func hostLocalStores(list *libcni.NetworkConfigList) []string {
	if list == nil {
		return nil
	}
	var dirs []string
	for _, p := range list.Plugins {
		if p.Network == nil || p.Network.IPAM.Type != "host-local" {
			continue
		}
		var conf struct {
			IPAM struct {
				DataDir string `json:"dataDir"`
			} `json:"ipam"`
		}
		// An unreadable config was refused by libcni already; the default dir is the
		// best guess for what the plugin used.
		_ = json.Unmarshal(p.Bytes, &conf)
		dataDir := conf.IPAM.DataDir
		if dataDir == "" {
			dataDir = hostLocalDefaultDataDir
		}
		dirs = append(dirs, filepath.Join(dataDir, list.Name))
	}
	return dirs
}

// storesOf returns the host-local stores pod id may hold addresses in: those of its
// cached attachments and of the current config. It is read before a DEL, which drops
// the cache.
func (m *Manager) storesOf(id string) []string {
	var lists []*libcni.NetworkConfigList
	if atts, err := m.cni.GetCachedAttachments(id); err == nil {
		for _, a := range atts {
			if a.ContainerID != id {
				continue
			}
			if list, err := libcni.NetworkConfFromBytes(a.Config); err == nil {
				lists = append(lists, list)
			}
		}
	}
	if list, _, err := m.current(); err == nil {
		lists = append(lists, list)
	}
	seen := map[string]bool{}
	var dirs []string
	for _, l := range lists {
		for _, d := range hostLocalStores(l) {
			if !seen[d] {
				seen[d] = true
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// releaseUnowned removes, from each host-local store in dirs, the reservations no
// owner was ever written into. It holds host-local's own lock meanwhile: every
// host-local holds it from before it creates a reservation until after it wrote the
// owner, so an empty file seen under the lock belongs to no plugin that still runs.
// Failures are logged: this only frees what is otherwise lost.
func (m *Manager) releaseUnowned(ctx context.Context, dirs []string) {
	for _, dir := range dirs {
		_, span := tracing.Start(ctx, spanIPAMFree)
		freed, err := m.releaseUnownedIn(ctx, dir)
		if span.IsRecording() {
			span.SetAttributes(attrStore.String(dir), attrReleased.Int(len(freed)))
		}
		tracing.End(span, err)
		if err != nil {
			m.log.Warn("release host-local reservations without an owner", "dir", dir, "err", err)
		}
		if len(freed) > 0 {
			m.log.Warn("released host-local reservations without an owner: a host-local was killed between reserving an address and recording its pod",
				"dir", dir, "ips", freed)
		}
	}
}

func (m *Manager) releaseUnownedIn(ctx context.Context, dir string) ([]string, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	unlock, err := lockHostLocalStore(ctx, dir, m.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list host-local store: %w", err)
	}
	var freed []string
	for _, e := range entries {
		if !e.Type().IsRegular() || net.ParseIP(e.Name()) == nil {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil || strings.TrimSpace(string(data)) != "" {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return freed, fmt.Errorf("remove reservation %s: %w", e.Name(), err)
		}
		freed = append(freed, e.Name())
	}
	return freed, nil
}

// lockHostLocalStore takes the flock host-local takes on its store (dir/lock), within
// limit and ctx: a host-local stuck with it held is killed at its own CNI timeout.
func lockHostLocalStore(ctx context.Context, dir string, limit time.Duration) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDONLY|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open host-local lock: %w", err)
	}
	deadline := time.Now().Add(limit)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock host-local store: %w", err)
		}
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("lock host-local store: still held after %s", limit)
		}
		if !sleepCtx(ctx, hostLocalLockPoll) {
			_ = f.Close()
			return nil, fmt.Errorf("lock host-local store: %w", ctx.Err())
		}
	}
}
