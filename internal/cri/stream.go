package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	vnetns "github.com/vishvananda/netns"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/cri/runscpf"
	"github.com/crisp-runtime/crisp/internal/streaming"
)

// streamDrain bounds how long output is still copied after an exec exited: a
// background child that inherited the stdio must not hold the session open forever.
const streamDrain = 2 * time.Second

// attachQuiet is how long an attach session whose client closed stdin (without
// stdin_once) waits for more output before it ends: long enough for a shell to answer
// the last line it was sent, short enough that the client returns promptly.
const attachQuiet = 500 * time.Millisecond

// shimCallTimeout bounds the cleanup calls made after the client's context ended.
const shimCallTimeout = 10 * time.Second

// URLServer hands out single-use streaming URLs; *streaming.Server is one.
type URLServer interface {
	GetExec(*runtime.ExecRequest) (*runtime.ExecResponse, error)
	GetAttach(*runtime.AttachRequest) (*runtime.AttachResponse, error)
	GetPortForward(*runtime.PortForwardRequest) (*runtime.PortForwardResponse, error)
}

// SetStreamServer gives the Service the server whose URLs Exec, Attach and
// PortForward return. It is called once, before the Service serves: the server is
// built after the Service because it needs the Service's StreamRuntime.
func (s *Service) SetStreamServer(srv URLServer) { s.stream = srv }

func (s *Service) streamServer() (URLServer, error) {
	if s.stream == nil {
		return nil, fmt.Errorf("streaming server is not running: %w", errdefs.ErrUnavailable)
	}
	return s.stream, nil
}

// StreamRuntime returns what the streaming server runs sessions with.
func (s *Service) StreamRuntime() streaming.Runtime { return &streamRuntime{s: s} }

// runningContainer resolves a container that must be running for a stream to reach it.
func (s *Service) runningContainer(id string) (*container, containerRecord, error) {
	c, err := s.resolveContainer(id)
	if err != nil {
		return nil, containerRecord{}, err
	}
	rec := c.snapshot()
	if rec.State != stateRunning {
		return nil, containerRecord{}, fmt.Errorf("container %s is not running: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	return c, rec, nil
}

// validStreams applies kubelet's rules for the streams of an exec or attach.
func validStreams(stdin, stdout, stderr, tty bool) error {
	if !stdin && !stdout && !stderr {
		return invalid("one of stdin, stdout and stderr must be set")
	}
	if tty && stderr {
		// A terminal has one output; kubelet never asks for both.
		return invalid("tty and stderr cannot both be true")
	}
	return nil
}

// Exec returns a streaming URL that runs a command in a running container.
func (s *Service) Exec(_ context.Context, req *runtime.ExecRequest) (*runtime.ExecResponse, error) {
	_, rec, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if len(req.GetCmd()) == 0 {
		return nil, toStatus(invalid("exec command is empty"))
	}
	if err := validStreams(req.GetStdin(), req.GetStdout(), req.GetStderr(), req.GetTty()); err != nil {
		return nil, toStatus(err)
	}
	srv, err := s.streamServer()
	if err != nil {
		return nil, toStatus(err)
	}
	// The full id goes into the token, so a prefix that later turns ambiguous still
	// names the container the caller meant.
	resp, err := srv.GetExec(&runtime.ExecRequest{
		ContainerId: rec.ID, Cmd: req.GetCmd(), Tty: req.GetTty(),
		Stdin: req.GetStdin(), Stdout: req.GetStdout(), Stderr: req.GetStderr(),
	})
	if err != nil {
		return nil, toStatus(fmt.Errorf("exec url: %w", err))
	}
	return resp, nil
}

// Attach returns a streaming URL connected to a running container's main process.
func (s *Service) Attach(_ context.Context, req *runtime.AttachRequest) (*runtime.AttachResponse, error) {
	_, rec, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if err := validStreams(req.GetStdin(), req.GetStdout(), req.GetStderr(), req.GetTty()); err != nil {
		return nil, toStatus(err)
	}
	srv, err := s.streamServer()
	if err != nil {
		return nil, toStatus(err)
	}
	resp, err := srv.GetAttach(&runtime.AttachRequest{
		ContainerId: rec.ID, Tty: req.GetTty(),
		Stdin: req.GetStdin(), Stdout: req.GetStdout(), Stderr: req.GetStderr(),
	})
	if err != nil {
		return nil, toStatus(fmt.Errorf("attach url: %w", err))
	}
	return resp, nil
}

// PortForward returns a streaming URL that forwards to ports in a ready pod's network.
func (s *Service) PortForward(_ context.Context, req *runtime.PortForwardRequest) (*runtime.PortForwardResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := s.readyPod(p.rec.ID); err != nil {
		return nil, toStatus(err)
	}
	if rt := s.cfg.Runtimes[p.rec.Handler]; isGVisor(rt) {
		// Each connection reads the runsc options again; a broken file fails here,
		// where the caller sees why, rather than on every connection.
		if _, err := runscOptions(rt); err != nil {
			return nil, toStatus(fmt.Errorf("port-forward to pod %s: runtime handler %q: %w", p.rec.ID, p.rec.Handler, errdefs.ErrFailedPrecondition.WithMessage(err.Error())))
		}
	}
	for _, port := range req.GetPort() {
		if port <= 0 || port > 65535 {
			return nil, toStatus(invalid("port %d is out of range", port))
		}
	}
	srv, err := s.streamServer()
	if err != nil {
		return nil, toStatus(err)
	}
	resp, err := srv.GetPortForward(&runtime.PortForwardRequest{PodSandboxId: p.rec.ID, Port: req.GetPort()})
	if err != nil {
		return nil, toStatus(fmt.Errorf("port-forward url: %w", err))
	}
	return resp, nil
}

// gvisorOptionsType is the TypeUrl of gVisor's shim options, as gVisor documents its
// shim's config for containerd.
const gvisorOptionsType = "io.containerd.runsc.v1.options"

// isGVisor reports whether a handler runs gVisor (a task-only handler naming gVisor's
// shim or sending its options): its sandbox keeps the pod's sockets in gVisor's own
// netstack, not in the pod's network namespace, so port-forward reaches its ports
// through runsc.
func isGVisor(rt config.Runtime) bool {
	if rt.Mode() != config.SandboxModeTask {
		return false
	}
	typ, _ := rt.Options["TypeUrl"].(string)
	return typ == gvisorOptionsType || filepath.Base(rt.Shim) == "containerd-shim-runsc-v1"
}

func (s *Service) readyPod(id string) (*controller.Status, error) {
	st, err := s.ctrl.Status(id)
	if err != nil {
		return nil, err
	}
	if st.State != controller.StateReady {
		return nil, fmt.Errorf("pod sandbox %s is not ready: %w", id, errdefs.ErrFailedPrecondition)
	}
	return st, nil
}

// streamRuntime runs the sessions of the streaming server. It is its own type because
// its methods share names (Exec, Attach, PortForward) with the CRI RPCs of Service.
type streamRuntime struct{ s *Service }

var _ streaming.Runtime = (*streamRuntime)(nil)

// Exec runs cmd in the container with the client's streams connected through FIFOs
// and returns when it exited: nil for 0, a utilexec.CodeExitError for another code,
// which the library turns into the status the client reads its exit code from.
func (r *streamRuntime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	s := r.s
	_, rec, err := s.runningContainer(containerID)
	if err != nil {
		return err
	}
	proc, err := s.execProcess(rec.ID, cmd, tty)
	if err != nil {
		return err
	}
	sio, err := openStreamFIFOs(filepath.Join(s.cfg.StateDir, "exec"), in, out, errw, tty)
	if err != nil {
		return err
	}
	defer sio.close()
	execID := sio.id

	if err := s.ctrl.Exec(ctx, controller.ExecSpec{
		SandboxID: rec.PodID, ContainerID: rec.ID, ExecID: execID, Process: proc, Terminal: tty,
		Stdin: sio.stdinPath, Stdout: sio.path(sio.stdout), Stderr: sio.path(sio.stderr),
	}); err != nil {
		return err
	}
	defer s.ctrl.DeleteExec(rec.PodID, rec.ID, execID)
	// The shim holds its own ends now; dropping our keep-alive writers lets the
	// output readers see EOF once the process is gone.
	sio.closeKeepAlive()
	done := make(chan struct{})
	defer close(done)
	sio.startStdin(in, func() {
		// Our writer is closed; the shim still holds one, so only CloseIO gives the
		// process its EOF.
		cctx, cancel := context.WithTimeout(context.Background(), shimCallTimeout)
		defer cancel()
		if err := s.ctrl.CloseIO(cctx, rec.PodID, rec.ID, execID); err != nil {
			s.log.Debug("close exec stdin", "container", rec.ID, "exec", execID, "err", err)
		}
	})
	if tty {
		go r.forwardResize(done, resize, rec.PodID, rec.ID, execID) //nolint:gosec // G118: each resize is one shim call bounded by shimCallTimeout; done ends the loop with the session
	}

	st, err := s.ctrl.WaitExec(ctx, rec.PodID, rec.ID, execID)
	if err != nil {
		if ctx.Err() != nil {
			// The client went away: the process must not outlive its session.
			kctx, cancel := context.WithTimeout(context.Background(), shimCallTimeout)
			_ = s.ctrl.KillExec(kctx, rec.PodID, rec.ID, execID, syscall.SIGKILL)
			_, _ = s.ctrl.WaitExec(kctx, rec.PodID, rec.ID, execID)
			cancel()
			return fmt.Errorf("exec %v in container %s: client gone: %w", cmd, rec.ID, ctx.Err())
		}
		return err
	}
	sio.waitOutput(streamDrain)
	if st.ExitStatus != 0 {
		return utilexec.CodeExitError{
			Err:  fmt.Errorf("command %v in container %s exited with code %d", cmd, rec.ID, st.ExitStatus),
			Code: int(st.ExitStatus),
		}
	}
	return nil
}

// Attach connects the client's streams to the container's main process until the
// client leaves or the container exits.
func (r *streamRuntime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	s := r.s
	c, rec, err := s.runningContainer(containerID)
	if err != nil {
		return err
	}
	if !c.config.GetStdin() {
		in = nil // the container has no stdin to feed
	}
	sio, err := openStreamFIFOs(filepath.Join(s.cfg.StateDir, "attach"), in, out, errw, tty)
	if err != nil {
		return err
	}
	defer sio.close()
	if err := s.ctrl.Attach(ctx, rec.PodID, rec.ID, sio.stdinPath, sio.path(sio.stdout), sio.path(sio.stderr)); err != nil {
		return err
	}
	sio.closeKeepAlive()
	done := make(chan struct{})
	defer close(done)
	stdinDone := make(chan struct{})
	sio.startStdin(in, func() {
		if c.config.GetStdinOnce() {
			// StdinOnce: the first attach's EOF is the container's EOF too.
			cctx, cancel := context.WithTimeout(context.Background(), shimCallTimeout)
			defer cancel()
			_ = s.ctrl.CloseIO(cctx, rec.PodID, rec.ID, "")
		}
		close(stdinDone)
	})
	if tty {
		go r.forwardResize(done, resize, rec.PodID, rec.ID, "") //nolint:gosec // G118: as in Exec
	}
	if in == nil {
		stdinDone = nil // never fires: only output or the container ends the session
	}
	select {
	case <-ctx.Done():
	case <-c.exited:
		sio.waitOutput(streamDrain)
	case <-sio.outputDone():
	case <-stdinDone:
		switch {
		case sio.stdout == nil && sio.stderr == nil:
		case c.config.GetStdinOnce() && !tty:
			// The container's stdin is closed too: keep streaming its output until it
			// exits or the client leaves. (containerd ends a terminal's session, like
			// the default case: its stdin ends only when the client detaches.)
			select {
			case <-ctx.Done():
			case <-c.exited:
				sio.waitOutput(streamDrain)
			case <-sio.outputDone():
			}
		default:
			// The client is done and the container's stdin stays open (or is a
			// terminal): the session ends, as containerd's does (`echo cmd | kubectl
			// attach -i` returns).
			// containerd drops the output at once; the answer to what was just sent
			// is still on its way, so it gets a moment first.
			sio.waitQuiet(ctx.Done(), c.exited, attachQuiet, streamDrain)
		}
	}
	return nil
}

func (r *streamRuntime) forwardResize(done <-chan struct{}, resize <-chan streaming.TerminalSize, podID, id, execID string) {
	for {
		select {
		case <-done:
			return
		case sz, ok := <-resize:
			if !ok {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), shimCallTimeout)
			if err := r.s.ctrl.ResizePty(ctx, podID, id, execID, uint32(sz.Width), uint32(sz.Height)); err != nil {
				r.s.log.Debug("resize tty", "container", id, "exec", execID, "err", err)
			}
			cancel()
		}
	}
}

// PortForward connects stream to 127.0.0.1:port inside the pod's network namespace,
// or, for a handler whose sandbox runs its own network stack (gVisor), inside that
// stack through the sandbox.
func (r *streamRuntime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	p, err := r.s.resolvePod(podSandboxID)
	if err != nil {
		return err
	}
	st, err := r.s.readyPod(p.rec.ID)
	if err != nil {
		return err
	}
	var conn net.Conn
	if rt := r.s.cfg.Runtimes[p.rec.Handler]; isGVisor(rt) {
		conn, err = r.s.dialSandbox(ctx, rt, st, port)
	} else {
		conn, err = dialInNetNS(ctx, st.NetNS, port)
	}
	if err != nil {
		return fmt.Errorf("port-forward to port %d of pod %s: %w", port, p.rec.ID, err)
	}
	defer conn.Close()

	go func() {
		// Client → pod. When the client finishes sending, half-close so the server
		// in the pod sees EOF but can still answer (through gVisor, with the proxy
		// patch of hack/gvisor.sh: docs/gvisor.md).
		_, _ = io.Copy(conn, stream)
		if hc, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
	}()
	back := make(chan error, 1)
	go func() {
		_, err := io.Copy(stream, conn)
		back <- err
	}()
	// The session ends when the pod side is done sending or the client went away;
	// the library then closes the stream, which also ends the client → pod copy.
	select {
	case err := <-back:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("port-forward from port %d of pod %s: %w", port, p.rec.ID, err)
		}
	case <-ctx.Done():
		_ = conn.Close()
		<-back
	}
	return nil
}

// dialSandbox connects to 127.0.0.1:port in the network stack of a gVisor pod's
// sandbox through runsc, run as the handler's options (ConfigPath) tell gVisor's shim
// to run it. The pod's sandbox container is the root container of the sandbox and
// has the pod's id.
func (s *Service) dialSandbox(ctx context.Context, rt config.Runtime, st *controller.Status, port int32) (net.Conn, error) {
	rc, err := runscOptions(rt)
	if err != nil {
		return nil, err
	}
	ns := st.Namespace
	if ns == "" {
		ns = "k8s.io" // the controller's default, for records written before it was kept
	}
	return rc.Dial(ctx, filepath.Join(s.cfg.StateDir, portForwardDir), ns, st.ID, port)
}

// portForwardDir is the state dir's directory of the unix sockets that runsc
// port-forward connects to, one private directory per connection being set up.
const portForwardDir = "portforward"

// runscOptions reads the runsc options file of a gVisor handler (its ConfigPath), as
// gVisor's shim reads it for each container; without one, the shim's defaults.
func runscOptions(rt config.Runtime) (runscpf.Config, error) {
	path, _ := rt.Options["ConfigPath"].(string)
	return runscpf.Load(path)
}

// dialInNetNS dials a TCP port on loopback inside the network namespace at nsPath
// (the host's when nsPath is empty: host-network pods). The socket is created on a
// thread switched into the namespace and stays there after the thread switches back.
func dialInNetNS(ctx context.Context, nsPath string, port int32) (net.Conn, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	d := net.Dialer{Timeout: 10 * time.Second}
	if nsPath == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	target, err := vnetns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer target.Close()

	goruntime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("open own network namespace: %w", err)
	}
	defer orig.Close()
	if err := vnetns.Set(target); err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("enter network namespace %s: %w", nsPath, err)
	}
	conn, dialErr := d.DialContext(ctx, "tcp", addr)
	if err := vnetns.Set(orig); err != nil {
		// The thread is stuck in the pod's namespace: leave it locked, so the Go
		// runtime ends it with this goroutine instead of reusing it.
		if conn != nil {
			_ = conn.Close()
		}
		return nil, fmt.Errorf("return to own network namespace: %w", err)
	}
	goruntime.UnlockOSThread()
	if dialErr != nil {
		return nil, dialErr
	}
	return conn, nil
}

// streamFIFOs is the FIFOs of one session: stdin written by us, stdout and stderr
// read by us and copied to the client.
type streamFIFOs struct {
	id  string
	dir string
	// stdinPath is the stdin FIFO, "" when the client has none. Our writer on it is
	// opened only once the shim's reader is (see startStdin).
	stdinPath      string
	stdout, stderr *os.File // our read ends; nil when the client did not ask
	keep           []*os.File
	// stdinMu guards stdin, our writer on the stdin FIFO, and the closing of ended.
	stdinMu sync.Mutex
	stdin   *os.File
	// ended is closed by close: a writer still waiting for the shim's reader gives up.
	ended   chan struct{}
	outWG   sync.WaitGroup
	outDone chan struct{}
	// wrote gets a token (without blocking) whenever output was copied to the client;
	// never closed.
	wrote     chan struct{}
	closeOnce sync.Once
}

// notifyWriter signals wrote after each write to w.
type notifyWriter struct {
	w     io.Writer
	wrote chan<- struct{}
}

func (n notifyWriter) Write(p []byte) (int, error) {
	nw, err := n.w.Write(p)
	select {
	case n.wrote <- struct{}{}:
	default: // a token is pending already
	}
	return nw, err
}

// openStreamFIFOs makes a session directory <parent>/<id> and opens the FIFOs of the
// streams the client asked for (a terminal has no stderr: it merges both outputs into
// stdout). close removes them all.
func openStreamFIFOs(parent string, in io.Reader, out, errw io.Writer, tty bool) (_ *streamFIFOs, retErr error) {
	id := newID()[:32]
	dir := filepath.Join(parent, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session dir: %w", err)
	}
	if tty {
		errw = nil
	}
	sf := &streamFIFOs{id: id, dir: dir, outDone: make(chan struct{}), wrote: make(chan struct{}, 1), ended: make(chan struct{})}
	defer func() {
		if retErr != nil {
			sf.close()
		}
	}()
	mk := func(name string) (string, error) {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			return "", fmt.Errorf("create fifo %s: %w", p, err)
		}
		return p, nil
	}
	if in != nil {
		p, err := mk("stdin")
		if err != nil {
			return nil, err
		}
		sf.stdinPath = p
	}
	for _, o := range []struct {
		name string
		dst  io.Writer
		f    **os.File
	}{{"stdout", out, &sf.stdout}, {"stderr", errw, &sf.stderr}} {
		if o.dst == nil {
			continue
		}
		p, err := mk(o.name)
		if err != nil {
			return nil, err
		}
		r, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open fifo %s: %w", p, err)
		}
		*o.f = r
		// Held until the shim has opened its end, so the reader does not see EOF
		// before anything was connected.
		w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open fifo %s: %w", p, err)
		}
		sf.keep = append(sf.keep, w)
		sf.outWG.Add(1)
		go func(dst io.Writer) {
			defer sf.outWG.Done()
			_, _ = io.Copy(notifyWriter{w: dst, wrote: sf.wrote}, r)
		}(o.dst)
	}
	go func() { sf.outWG.Wait(); close(sf.outDone) }()
	return sf, nil
}

// path is the FIFO path of f, "" for none.
func (sf *streamFIFOs) path(f *os.File) string {
	if f == nil {
		return ""
	}
	return f.Name()
}

func (sf *streamFIFOs) closeKeepAlive() {
	for _, w := range sf.keep {
		_ = w.Close()
	}
	sf.keep = nil
}

// stdinOpenRetry bounds the pause between two attempts of openStdin to find the
// shim's reader of the stdin FIFO.
const stdinOpenRetry = 20 * time.Millisecond

// startStdin copies the client's stdin into the FIFO; on the client's EOF it closes
// our end and calls eof (CloseIO). It writes only once the shim's reader of the FIFO
// is open: containerd's shims (and gVisor's) open their reader in a goroutine that
// may run after the exec's Start returned, and a FIFO whose last writer leaves before that reader
// came drops what it held, and then blocks the reader's open for good, so the process
// would never read EOF. Waiting for the shim to drain what was written does not
// cover an empty input, which leaves nothing to drain. containerd's CRI waits the
// same way: it opens its end O_WRONLY, which completes only with a reader there. The goroutine ends at the latest
// when the library closes the connection after the session, which fails the pending
// read.
func (sf *streamFIFOs) startStdin(in io.Reader, eof func()) {
	if in == nil || sf.stdinPath == "" {
		return
	}
	go func() {
		w, err := sf.openStdin()
		if err != nil {
			return // the session ended first, or the FIFO is gone with it
		}
		_, err = io.Copy(w, in)
		sf.closeStdin()
		if err == nil {
			eof()
		}
	}()
}

// openStdin opens our writer on the stdin FIFO once the FIFO has a reader: an
// O_WRONLY|O_NONBLOCK open fails with ENXIO until then. It gives up when the session
// ends.
func (sf *streamFIFOs) openStdin() (*os.File, error) {
	delay := time.Millisecond
	for {
		f, err := os.OpenFile(sf.stdinPath, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			sf.stdinMu.Lock()
			defer sf.stdinMu.Unlock()
			select {
			case <-sf.ended:
				_ = f.Close()
				return nil, errStreamEnded
			default:
			}
			sf.stdin = f
			return f, nil
		}
		if !errors.Is(err, syscall.ENXIO) {
			return nil, fmt.Errorf("open fifo %s: %w", sf.stdinPath, err)
		}
		select {
		case <-sf.ended:
			return nil, errStreamEnded
		case <-time.After(delay):
		}
		delay = min(2*delay, stdinOpenRetry)
	}
}

// errStreamEnded: the session ended before the shim opened the stdin FIFO.
var errStreamEnded = errors.New("stream session ended")

// closeStdin closes our writer on the stdin FIFO, if open.
func (sf *streamFIFOs) closeStdin() {
	sf.stdinMu.Lock()
	defer sf.stdinMu.Unlock()
	if sf.stdin != nil {
		_ = sf.stdin.Close()
		sf.stdin = nil
	}
}

func (sf *streamFIFOs) outputDone() <-chan struct{} { return sf.outDone }

// waitOutput gives the output copiers up to d to drain.
func (sf *streamFIFOs) waitOutput(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-sf.outDone:
	case <-t.C:
	}
}

// waitQuiet returns once no output has been copied for quiet, the output ended, longest
// passed (output that never pauses), stop fired, or exited fired and the output drained.
func (sf *streamFIFOs) waitQuiet(stop, exited <-chan struct{}, quiet, longest time.Duration) {
	idle := time.NewTimer(quiet)
	defer idle.Stop()
	limit := time.NewTimer(longest)
	defer limit.Stop()
	for {
		select {
		case <-sf.wrote:
			idle.Reset(quiet)
		case <-exited:
			sf.waitOutput(streamDrain)
			return
		case <-idle.C:
			return
		case <-limit.C:
			return
		case <-stop:
			return
		case <-sf.outDone:
			return
		}
	}
}

// close releases every fd and waits for the output copiers, which end once their
// read ends are closed.
func (sf *streamFIFOs) close() {
	sf.closeOnce.Do(func() {
		sf.closeKeepAlive()
		sf.stdinMu.Lock()
		close(sf.ended)
		sf.stdinMu.Unlock()
		// Also fails a write blocked on a process that does not read its stdin.
		sf.closeStdin()
		for _, f := range []*os.File{sf.stdout, sf.stderr} {
			if f != nil {
				_ = f.Close()
			}
		}
		sf.outWG.Wait()
		_ = os.RemoveAll(sf.dir)
	})
}
