package controller

import (
	"context"
	"fmt"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"

	options "github.com/crisp-runtime/crisp/api/options/v1"
)

// ResizePty resizes the terminal of a container's init (execID "") or of an exec.
func (c *Controller) ResizePty(ctx context.Context, sandboxID, id, execID string, width, height uint32) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if _, err := tc.ResizePty(ctx, &taskapi.ResizePtyRequest{ID: id, ExecID: execID, Width: width, Height: height}); err != nil {
		return fmt.Errorf("resize tty of container %s exec %q: %w", id, execID, fromShim(err))
	}
	return nil
}

// CloseIO closes the stdin of a container's init (execID "") or of an exec, so the
// process reads EOF.
func (c *Controller) CloseIO(ctx context.Context, sandboxID, id, execID string) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if t := c.tasks.IO(id); t != nil && execID == "" {
		t.CloseStdin()
	}
	if _, err := tc.CloseIO(ctx, &taskapi.CloseIORequest{ID: id, ExecID: execID, Stdin: true}); err != nil {
		return fmt.Errorf("close stdin of container %s exec %q: %w", id, execID, fromShim(err))
	}
	return nil
}

// Attach has the shim connect FIFOs (paths, "" for none) to a running container's
// main process. It returns once the shim has opened them; the attachment lasts until
// the caller closes its ends or the container exits.
func (c *Controller) Attach(ctx context.Context, sandboxID, id, stdin, stdout, stderr string) error {
	if c.isTaskOnly(sandboxID) {
		return c.tasks.Attach(sandboxID, id, stdin, stdout, stderr)
	}
	client, err := c.shimClient(sandboxID)
	if err != nil {
		return err
	}
	req := &options.AttachRequest{ContainerId: id, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if _, err := client.Attach(ctx, req); err != nil {
		return fmt.Errorf("attach to container %s: %w", id, fromShim(err))
	}
	return nil
}
