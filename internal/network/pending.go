package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/libcni"
)

// What happens when a pod's CNI DEL keeps failing.
//
// A failed DEL is an error for the first teardownAttempts-1 teardowns of a pod, as in
// containerd: StopPodSandbox fails (Unavailable, or DeadlineExceeded for a plugin
// killed at the timeout, naming the network and plugin), kubelet retries it, and the
// namespace and libcni's cached result stay so that the retry is a DEL like the first.
// A plugin that recovers (a datastore back, a binary fixed) then frees everything.
//
// On the last attempt crisp stops making the pod wait for its plugin. kubelet stops a
// pod before it removes it and never removes one it could not stop, so failing for
// ever would keep the pod Terminating, its netns pinned and its veth up for as long as
// the plugin is broken. Instead Teardown reports success, the controller removes the
// namespace (which destroys the pod's end of the veth, and the kernel the host end
// with it), and the DEL is handed to a background retrier: it is kept under
// Config.PendingDir, so it survives a restart, and retried without the namespace
// (plugins release what lives outside it: the IPAM reservation, NAT rules; see
// standin.go) with a growing interval until the plugin succeeds. What only the plugin
// can free, such as a host-local reservation, is freed when the plugin works again,
// without anyone having to remember the pod; until then it stays reserved rather than
// being handed to another pod.
//
// A DEL that undoes a failed ADD, or the creation of a pod that failed later (Release),
// is handed to the retrier at once: the pod never existed for kubelet, so nobody would
// ever call StopPodSandbox for it.

// teardownAttempts is how many failed teardowns of one pod return an error before
// the DEL is handed to the background retrier.
const teardownAttempts = 3

// defaultRetryInterval is the first wait before a pending DEL is retried.
const defaultRetryInterval = 10 * time.Second

// maxRetryInterval caps the doubling wait between retries of pending DELs.
const maxRetryInterval = 5 * time.Minute

// pendingDel is a DEL left to the retrier: what libcni needs to run it without the
// pod's namespace.
type pendingDel struct {
	Network        json.RawMessage `json:"network"` // the conflist the pod was set up with
	ContainerID    string          `json:"containerId"`
	IfName         string          `json:"ifName"`
	Args           [][2]string     `json:"args,omitempty"`
	CapabilityArgs map[string]any  `json:"capabilityArgs,omitempty"`
	Since          time.Time       `json:"since"`
}

// unavailableError marks a teardown failure as retryable (gRPC Unavailable) without
// changing its message.
type unavailableError struct{ error }

func (e unavailableError) Unwrap() []error { return []error{e.error, errdefs.ErrUnavailable} }

// retryable marks err as worth retrying; a timeout or a caller that gave up keeps
// its own kind.
func retryable(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return unavailableError{err}
}

// attachment is one network of a pod to tear down.
type attachment struct {
	list *libcni.NetworkConfigList
	rt   *libcni.RuntimeConf
}

// teardownFailed counts a failed teardown of p: an error until the last of attempts,
// then the failed DELs go to the retrier and the pod may go.
func (m *Manager) teardownFailed(p Pod, failed []attachment, attempts int, err error) error {
	m.mu.Lock()
	m.failures[p.ID]++
	n := m.failures[p.ID]
	m.mu.Unlock()
	// The caller names the pod; this says what happens next.
	err = fmt.Errorf("CNI DEL of %s/%s failed, attempt %d of %d (after the last the namespace goes and the DEL is retried in the background): %w",
		p.Namespace, p.Name, n, attempts, err)
	if n < attempts {
		return retryable(err)
	}
	for _, a := range failed {
		if derr := m.deferDel(a.list, a.rt); derr != nil {
			// Not even kept for later: keep failing, so that the caller keeps trying.
			return retryable(fmt.Errorf("%w; keeping it for a background retry failed too: %w", err, derr))
		}
	}
	m.mu.Lock()
	delete(m.failures, p.ID)
	m.mu.Unlock()
	m.log.Warn("CNI DEL keeps failing: the pod goes without it; its network namespace can be removed and the DEL is retried in the background",
		"pod", p.ID, "err", err, "pending_dir", m.cfg.PendingDir)
	return nil
}

// teardownDone forgets the failed attempts of a pod whose network is gone.
func (m *Manager) teardownDone(id string) {
	m.mu.Lock()
	delete(m.failures, id)
	m.mu.Unlock()
}

// deferDel keeps the DEL of one attachment for the background retrier and starts it.
func (m *Manager) deferDel(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	data, err := json.Marshal(pendingDel{
		Network:     list.Bytes,
		ContainerID: rt.ContainerID, IfName: rt.IfName, Args: rt.Args, CapabilityArgs: rt.CapabilityArgs,
		Since: time.Now().UTC(),
	})
	if err != nil {
		return fmt.Errorf("encode pending CNI DEL of %s: %w", rt.ContainerID, err)
	}
	if err := writeFileAtomic(m.pendingPath(rt.ContainerID), data); err != nil {
		return fmt.Errorf("keep pending CNI DEL: %w", err)
	}
	m.kickRetrier()
	return nil
}

func (m *Manager) pendingPath(id string) string {
	return filepath.Join(m.cfg.PendingDir, id+".json")
}

// isPending reports whether the pod's DEL belongs to the retrier now.
func (m *Manager) isPending(id string) bool {
	_, err := os.Stat(m.pendingPath(id))
	return err == nil
}

// pendingFiles lists the kept DELs.
func (m *Manager) pendingFiles() []string {
	entries, err := os.ReadDir(m.cfg.PendingDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("list pending CNI DELs", "dir", m.cfg.PendingDir, "err", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(m.cfg.PendingDir, e.Name()))
		}
	}
	return out
}

// Pending returns the ids of the pods whose DEL the background retrier still owes.
func (m *Manager) Pending() []string {
	var ids []string
	for _, f := range m.pendingFiles() {
		ids = append(ids, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	return ids
}

// kickRetrier starts the retrier unless it runs or the manager is closed. It runs
// only while DELs are pending.
func (m *Manager) kickRetrier() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retrying || m.ctx.Err() != nil {
		return
	}
	m.retrying = true
	m.wg.Add(1)
	go m.retryPending()
}

// retryPending retries the pending DELs with a doubling wait until none is left or
// the manager is closed.
func (m *Manager) retryPending() {
	defer m.wg.Done()
	wait := m.cfg.RetryInterval
	for {
		if !sleepCtx(m.ctx, wait) {
			m.stopRetrying()
			return
		}
		if m.retryPendingOnce(m.ctx) == 0 {
			m.mu.Lock()
			// A DEL deferred during the pass is seen here, under the lock kickRetrier takes.
			if len(m.pendingFiles()) == 0 {
				m.retrying = false
				m.mu.Unlock()
				return
			}
			m.mu.Unlock()
		}
		wait = min(wait*2, maxRetryInterval)
	}
}

func (m *Manager) stopRetrying() {
	m.mu.Lock()
	m.retrying = false
	m.mu.Unlock()
}

// retryPendingOnce tries every pending DEL once and returns how many still fail.
func (m *Manager) retryPendingOnce(ctx context.Context) int {
	left := 0
	for _, f := range m.pendingFiles() {
		if ctx.Err() != nil {
			return left + 1
		}
		if err := m.retryOne(ctx, f); err != nil {
			left++
			m.log.Warn("pending CNI DEL failed again; retrying later", "file", f, "err", err)
		}
	}
	return left
}

// retryOne runs one pending DEL, without the pod's namespace, and drops it once done.
func (m *Manager) retryOne(ctx context.Context, path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var p pendingDel
	if err := json.Unmarshal(data, &p); err != nil {
		// It can never succeed; keeping it would retry it for ever.
		m.log.Error("dropping unreadable pending CNI DEL", "file", path, "err", err)
		return os.Remove(path)
	}
	list, err := libcni.NetworkConfFromBytes(p.Network)
	if err != nil {
		m.log.Error("dropping pending CNI DEL with an unreadable network config", "file", path, "pod", p.ContainerID, "err", err)
		return os.Remove(path)
	}
	rt := &libcni.RuntimeConf{ContainerID: p.ContainerID, IfName: p.IfName, Args: p.Args, CapabilityArgs: p.CapabilityArgs}
	if err := m.delAttachment(ctx, list, rt); err != nil {
		return fmt.Errorf("network %q of pod %s: %w", list.Name, p.ContainerID, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	m.log.Info("pending CNI DEL done", "pod", p.ContainerID, "network", list.Name, "pending_since", p.Since)
	return nil
}

// Close stops the background retrier; pending DELs stay kept for the next start. The
// masquerade rules stay for the pods that still rely on them (they keep running
// across a restart); those of no pod are removed, so that a node, or a test, that
// stops crisp without pods keeps no rules of it.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
	if err := m.syncMasq(context.Background(), nil); err != nil {
		m.log.Warn("remove pod subnet masquerade rules no pod needs", "err", err)
	}
}
