package tasksandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"google.golang.org/protobuf/proto"
)

// orphanCreateWait is how long an orphan container of a task-only shim may still be
// being created: the shim knows a container only once `runc create` (or its
// equivalent) has returned, and it goes on with a Create whose caller died.
const orphanCreateWait = 3 * time.Second

// orphanDeleteTimeout bounds the task Delete of an orphan container of a task-only
// shim. containerd's runc shim was seen, rarely, never answering the Delete of a
// container whose Create had a caller that died; recovery must not wait on it.
const orphanDeleteTimeout = 5 * time.Second

// CleanDeadShim kills what a dead task-only shim's pod still runs: unlike crisp's
// shim, whose delete ends the whole pod, a task-only shim's delete ends the one
// container (and its mounts) it names, so it runs for every container and then for
// the pause container.
func (s *Sandboxer) CleanDeadShim(ctx context.Context, p Pod) error {
	var errs []error
	for id := range s.PodContainers(p.ID) {
		if err := p.Binary.Delete(ctx, id, s.containerBundle(id)); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", id, err))
		}
		s.DropIO(id)
	}
	if err := p.Binary.Delete(ctx, p.ID, p.Bundle); err != nil {
		if p.Started {
			errs = append(errs, fmt.Errorf("pause container: %w", err))
		} else {
			// A pod whose start was cut short may have no pause container: containerd
			// 1.x's shim cannot even run delete without the files Create writes.
			s.log.Warn("delete of a pause container that may never have been created failed", "pod", p.ID, "err", err)
		}
	}
	return errors.Join(errs...)
}

// SettlePause waits, up to orphanCreateWait, for the shim tc reaches to know the pause
// container of a pod whose start was cut short: a Create the dead criserver sent goes
// on in the shim, and a teardown that ran before it ended would leave the container
// behind. A create the shim never finished is cleaned up (see cleanAbortedCreate).
func (s *Sandboxer) SettlePause(ctx context.Context, tc taskapi.TTRPCTaskService, p Pod) {
	if p.Started || awaitTask(ctx, tc, p.ID) {
		return
	}
	s.cleanAbortedCreate(ctx, p, p.ID, p.Bundle)
}

// DeleteSettled deletes orphan container id from pod p's task-only shim, waiting up to
// orphanCreateWait for a create still in flight to finish first: deleted too early,
// the container would be made after the delete and never found again. A create the
// shim never finished, or a delete it does not answer, is cleaned up without the shim.
func (s *Sandboxer) DeleteSettled(ctx context.Context, tc taskapi.TTRPCTaskService, p Pod, id string) error {
	if !awaitTask(ctx, tc, id) {
		s.cleanAbortedCreate(ctx, p, id, s.containerBundle(id))
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, orphanDeleteTimeout)
	defer cancel()
	_, err := tc.Delete(dctx, &taskapi.DeleteRequest{ID: id})
	if err != nil && dctx.Err() != nil && ctx.Err() == nil {
		s.log.Warn("shim did not delete an orphan container in time; removing it without the shim", "pod", p.ID, "container", id, "timeout", orphanDeleteTimeout)
		s.cleanAbortedCreate(ctx, p, id, s.containerBundle(id))
		return nil
	}
	return err
}

// awaitTask polls the shim for task id for up to orphanCreateWait; false if the shim
// never knew it.
func awaitTask(ctx context.Context, tc taskapi.TTRPCTaskService, id string) bool {
	deadline := time.Now().Add(orphanCreateWait)
	for {
		_, err := tc.State(ctx, &taskapi.StateRequest{ID: id})
		if err == nil || !isNotFound(err) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanAbortedCreate removes what a create the shim never finished left: the shim
// cancels a Create whose caller went away, which kills runc in the middle of `runc
// create`, leaving its state dir (without state.json) and the cgroups it had made.
// The shim's delete command runs `runc delete --force`, which removes such a state
// dir; the cgroups, empty, are removed here (cgroupfs; under the systemd driver a
// scope without processes is collected by systemd).
func (s *Sandboxer) cleanAbortedCreate(ctx context.Context, p Pod, id, bundle string) {
	if err := p.Binary.Delete(ctx, id, bundle); err != nil {
		s.log.Debug("delete of an unfinished create", "pod", p.ID, "id", id, "err", err)
		// containerd 1.x's runc shim records its runc only once the create succeeded,
		// so its delete cannot run after one that was cut short: ask runc directly.
		if err := s.runcDelete(ctx, p, id); err != nil {
			s.log.Debug("runc delete of an unfinished create", "pod", p.ID, "id", id, "err", err)
		}
	}
	var spec struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil || json.Unmarshal(data, &spec) != nil {
		return
	}
	if n := removeEmptyCgroup(spec.Linux.CgroupsPath); n > 0 {
		s.log.Info("removed the cgroups of a create cut short", "pod", p.ID, "id", id, "cgroups", n)
	}
}

// runcDelete runs `runc delete --force id` with the runc and root a runc shim of p's
// handler uses (its options' BinaryName and Root, in the shim's namespace); runc
// removes the state dir of a create it did not finish. Other shims: nothing to do.
func (s *Sandboxer) runcDelete(ctx context.Context, p Pod, id string) error {
	if !IsRuncShim(p.Shim) {
		return nil
	}
	var o runcoptions.Options
	if a := s.opts[p.Handler]; a != nil {
		if err := proto.Unmarshal(a.GetValue(), &o); err != nil {
			return fmt.Errorf("decode runc options: %w", err)
		}
	}
	bin, root := o.GetBinaryName(), o.GetRoot()
	if bin == "" {
		bin = "runc"
	}
	if root == "" {
		root = "/run/containerd/runc" // containerd's runc shims' default
	}
	out, err := exec.CommandContext(ctx, bin, "--root", filepath.Join(root, p.Namespace), "delete", "--force", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s delete: %w: %s", bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeEmptyCgroup removes cgroupfs path (as in an OCI cgroupsPath) from every
// hierarchy under /sys/fs/cgroup where it exists and is empty; it never removes a
// cgroup that holds processes or children (rmdir fails on those). It returns how many
// it removed.
func removeEmptyCgroup(cgPath string) int {
	if !filepath.IsAbs(cgPath) || filepath.Clean(cgPath) != cgPath || cgPath == "/" {
		return 0 // a systemd slice:prefix:name, or nothing to remove
	}
	const root = "/sys/fs/cgroup"
	dirs := []string{root}
	if entries, err := os.ReadDir(root); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(root, e.Name()))
			}
		}
	}
	n := 0
	for _, d := range dirs {
		if os.Remove(filepath.Join(d, cgPath)) == nil {
			n++
		}
	}
	return n
}
