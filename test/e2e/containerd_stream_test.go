package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/remotecommand"
	clientexec "k8s.io/client-go/util/exec"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ctrPid is the pid containerd reports for a running container (verbose status).
func (c *ctrd) ctrPid(ctx context.Context, t *testing.T, id string) int {
	t.Helper()
	resp, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	pid := verbosePid(t, resp.GetInfo())
	if resp.GetStatus().GetState() != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container %s is %v with pid %d", id, resp.GetStatus().GetState(), pid)
	}
	return pid
}

// execURL asks containerd for an exec session's URL on its streaming server.
func (c *ctrd) execURL(ctx context.Context, t *testing.T, req *cri.ExecRequest) string {
	t.Helper()
	resp, err := c.rt.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec %v: %v", req.Cmd, err)
	}
	return resp.Url
}

// streaming drives containerd's streaming server on handler's pod, the way kubectl
// exec, attach and port-forward do: exec with stdin, an exit code, 1 MiB of output
// arriving whole, exec with a terminal and a resize, attach with
// stdin to a running container (its log keeps what was typed), attach to a terminal
// container with a resize, and a 200 kB round trip through a port-forward to an echo
// server in the pod. containerd serves all of it from the FIFOs and the netns it gave
// the shim, so this checks that crisp's shim wires a task's and an exec's stdio and
// terminal as containerd's runc shim does.
func (c *ctrd) streaming(t *testing.T, handler string) {
	ctx := ctxT(t)
	before := c.leftovers()
	pod := c.podConfig("stream-" + handler)
	podID := c.runPod(ctx, t, pod, handler)
	defer func() {
		c.removePod(ctx, t, podID)
		c.assertClean(t, 20*time.Second, before)
	}()

	// echo: cat on its stdin (attach), a 1 MiB file, and a persistent echo server
	// (nc -ll -e cat) on 8081 for the port-forward.
	cfg := c.ctrConfig("echo", "sh", "-c",
		"head -c 1048576 /dev/urandom > /tmp/mb && (nc -ll -p 8081 -e cat &) && echo serving && exec cat")
	cfg.Stdin = true
	echo, err := c.createStart(ctx, podID, pod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	echoPid := c.ctrPid(ctx, t, echo)
	echoLog := filepath.Join(pod.LogDirectory, cfg.LogPath)
	ctrdWaitLog(t, echoLog, "stdout serving", 10*time.Second)

	t.Run("exec-stdin", func(t *testing.T) {
		payload := strings.Repeat("fed through containerd\n", 3000)
		var out bytes.Buffer
		u := c.execURL(ctx, t, &cri.ExecRequest{ContainerId: echo, Cmd: []string{"cat"}, Stdin: true, Stdout: true})
		if err := stream(ctx, t, u, spdyTransport, remotecommand.StreamOptions{Stdin: strings.NewReader(payload), Stdout: &out}); err != nil {
			t.Fatalf("exec cat: %v", err)
		}
		if out.String() != payload {
			t.Errorf("exec cat returned %d bytes, sent %d", out.Len(), len(payload))
		}
		u = c.execURL(ctx, t, &cri.ExecRequest{ContainerId: echo, Cmd: []string{"sh", "-c", "echo err >&2; exit 7"}, Stdout: true, Stderr: true})
		var stderr bytes.Buffer
		err := stream(ctx, t, u, spdyTransport, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: &stderr})
		var ce clientexec.CodeExitError
		if !errors.As(err, &ce) || ce.Code != 7 || stderr.String() != "err\n" {
			t.Errorf("exec exit 7: %T %v, stderr %q", err, err, stderr.String())
		}
	})

	t.Run("exec-1MiB", func(t *testing.T) {
		inside := strings.Fields(c.execSync(ctx, t, echo, "md5sum", "/tmp/mb"))
		var out bytes.Buffer
		u := c.execURL(ctx, t, &cri.ExecRequest{ContainerId: echo, Cmd: []string{"cat", "/tmp/mb"}, Stdout: true})
		if err := stream(ctx, t, u, spdyTransport, remotecommand.StreamOptions{Stdout: &out}); err != nil {
			t.Fatalf("exec cat /tmp/mb: %v", err)
		}
		if out.Len() != 1<<20 || len(inside) == 0 || fmt.Sprintf("%x", md5.Sum(out.Bytes())) != inside[0] {
			t.Errorf("streaming exec: %d bytes, md5 %x; inside %v", out.Len(), md5.Sum(out.Bytes()), inside)
		}
		ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: echo, Cmd: []string{"cat", "/tmp/mb"}, Timeout: 30})
		if err != nil || len(ex.Stdout) != 1<<20 || len(inside) == 0 || fmt.Sprintf("%x", md5.Sum(ex.Stdout)) != inside[0] {
			t.Errorf("ExecSync: %d bytes, md5 %x (%v); inside %v", len(ex.GetStdout()), md5.Sum(ex.GetStdout()), err, inside)
		}
	})

	// SPDY only (kubectl's transport up to 1.29): containerd's streaming server
	// answers client-go's websocket upgrade with 403 on every handler, its own runc
	// shim's too.
	t.Run("exec-tty", func(t *testing.T) {
		u := c.execURL(ctx, t, &cri.ExecRequest{ContainerId: echo, Cmd: []string{"sh"}, Stdin: true, Tty: true, Stdout: true})
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		checkExecTTY(sctx, t, u, spdyTransport, time.Second)
	})

	t.Run("attach-stdin", func(t *testing.T) {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s := attachOn(actx, t, c.rt, echo, spdyTransport, false, nil)
		// Until the session is connected a line may not reach it: type it again.
		for {
			if _, err := s.stdin.Write([]byte("attached-1\n")); err != nil {
				t.Fatalf("attach session ended: %v", err)
			}
			if s.out.wait("attached-1", time.Second) {
				break
			}
			if actx.Err() != nil {
				t.Fatalf("attach: the echo never came back: %q", s.out.String())
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Contains(logLines(t, echoLog), "stdout attached-1") {
			if time.Now().After(deadline) {
				t.Fatalf("the attached line is not in the log: %q", logLines(t, echoLog))
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The client closes its stdin: the session ends, the container (stdin_once
		// unset) keeps running.
		s.stdin.Close()
		s.ended(t, 10*time.Second)
		if pid := c.ctrPid(ctx, t, echo); pid != echoPid {
			t.Errorf("echo's pid %d after the attach session, was %d", pid, echoPid)
		}
	})

	t.Run("attach-tty", func(t *testing.T) {
		tcfg := c.ctrConfig("shell", "sh")
		tcfg.Stdin, tcfg.Tty = true, true
		shell, err := c.createStart(ctx, podID, pod, tcfg)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.rt.Attach(ctx, &cri.AttachRequest{ContainerId: shell, Stdin: true, Stdout: true, Tty: true})
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s := startTTY(tctx, t, resp.Url, spdyTransport, 77, 22)
		s.askUntil(tctx, t, "tty attach", "echo tty-$((1+2)) $(stty size)", "tty-3 22 77", time.Second)
		// exit ends the shell, so the container and the session.
		if err := s.end(tctx, t, "tty attach", "exit 4"); err != nil {
			t.Errorf("tty attach ended with %v", err)
		}
		if st := c.waitExit(ctx, t, shell, 10*time.Second); st.ExitCode != 4 {
			t.Errorf("shell exit code %d, want 4", st.ExitCode)
		}
	})

	t.Run("portforward", func(t *testing.T) {
		// client-go ends the whole session on a refused connection: forward once the
		// echo server listens.
		waitListening(t, echoPid, 8081)
		pr, err := c.rt.PortForward(ctx, &cri.PortForwardRequest{PodSandboxId: podID, Port: []int32{8081}})
		if err != nil {
			t.Fatalf("PortForward: %v", err)
		}
		local, stop := forwardURL(t, pr.Url, 8081)
		defer stop()
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
		if err != nil {
			t.Fatalf("dial the forwarded port: %v", err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		sent := make([]byte, 200_000)
		_, _ = rand.Read(sent)
		werr := make(chan error, 1)
		go func() { _, err := conn.Write(sent); werr <- err }()
		got := make([]byte, len(sent))
		n, err := io.ReadFull(conn, got)
		if err != nil || !bytes.Equal(got, sent) {
			t.Errorf("port-forward round trip: %d of %d bytes back (%v), equal %v", n, len(sent), err, bytes.Equal(got[:n], sent[:n]))
		}
		if err := <-werr; err != nil {
			t.Errorf("port-forward write: %v", err)
		}
	})
}

// execSync runs cmd in container id through containerd and returns its stdout,
// failing the test on an error or a non-zero exit.
func (c *ctrd) execSync(ctx context.Context, t *testing.T, id string, cmd ...string) string {
	t.Helper()
	ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 30})
	if err != nil || ex.ExitCode != 0 {
		t.Fatalf("ExecSync %v: %v %v (stderr %q)", cmd, ex.GetExitCode(), err, ex.GetStderr())
	}
	return string(ex.Stdout)
}
