package controller

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"
)

// CheckpointSpec says where a container's CRIU images go.
type CheckpointSpec struct {
	SandboxID, ID string
	// ImagesDir receives the CRIU images (and libcontainer's descriptors.json).
	ImagesDir string
	// WorkDir receives CRIU's dump.log and stats-dump.
	WorkDir string
	// Exit stops the container after the dump; otherwise it keeps running.
	Exit bool
}

// CheckpointContainer has the pod's shim dump a running container with CRIU. The
// options are containerd's runc CheckpointOptions, which any runc-style shim reads.
func (c *Controller) CheckpointContainer(ctx context.Context, cs CheckpointSpec) error {
	tc, sb, err := c.task(cs.SandboxID)
	if err != nil {
		return err
	}
	if sb.isTaskOnly() {
		return fmt.Errorf("checkpoint container %s: pod %s runs on task-only shim %s, and crisp checkpoints only with its own shim: %w", cs.ID, cs.SandboxID, sb.rec.Shim, errdefs.ErrNotImplemented)
	}
	opts, err := anypb.New(&runcoptions.CheckpointOptions{Exit: cs.Exit, ImagePath: cs.ImagesDir, WorkPath: cs.WorkDir})
	if err != nil {
		return fmt.Errorf("encode checkpoint options: %w", err)
	}
	if _, err := tc.Checkpoint(ctx, &taskapi.CheckpointTaskRequest{ID: cs.ID, Path: cs.ImagesDir, Options: opts}); err != nil {
		return fmt.Errorf("checkpoint container %s: %w", cs.ID, fromShim(err))
	}
	return nil
}

// ContainerBundle is the bundle directory of a container: its spec (config.json) and,
// for a container restored from a checkpoint, the CRIU images.
func (c *Controller) ContainerBundle(id string) string { return c.opts.containerBundle(id) }

// restoreImagesDir is where a container created from a checkpoint keeps its CRIU
// images: in its bundle, so that they go with it.
const restoreImagesDir = "checkpoint"

// moveCheckpoint moves the CRIU images of cs into its bundle and returns their path
// there. Both are below the state dir, so it is a rename.
func moveCheckpoint(cs ContainerSpec, bundle string) (string, error) {
	if cs.Checkpoint == "" {
		return "", nil
	}
	dst := filepath.Join(bundle, restoreImagesDir)
	if err := os.Rename(cs.Checkpoint, dst); err != nil {
		return "", fmt.Errorf("move checkpoint of container %s into its bundle: %w", cs.ID, err)
	}
	return dst, nil
}

// PauseContainer has the pod's shim freeze a running container (task Pause).
func (c *Controller) PauseContainer(ctx context.Context, sandboxID, id string) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if _, err := tc.Pause(ctx, &taskapi.PauseRequest{ID: id}); err != nil {
		return fmt.Errorf("pause container %s: %w", id, fromShim(err))
	}
	return nil
}

// ResumeContainer has the pod's shim thaw a paused container (task Resume); a
// container that is not paused is left as it is.
func (c *Controller) ResumeContainer(ctx context.Context, sandboxID, id string) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if _, err := tc.Resume(ctx, &taskapi.ResumeRequest{ID: id}); err != nil {
		return fmt.Errorf("resume container %s: %w", id, fromShim(err))
	}
	return nil
}
