package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	clientexec "k8s.io/client-go/util/exec"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// execURL asks criserver for an exec URL.
func (e *env) execURL(ctx context.Context, t *testing.T, req *cri.ExecRequest) string {
	t.Helper()
	resp, err := e.rt.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec %v: %v", req.Cmd, err)
	}
	return resp.Url
}

// transport is how a test client reaches the streaming server.
type transport string

const (
	spdyTransport transport = "spdy"
	// wsTransport is client-go's websocket executor, which offers v5 first.
	wsTransport transport = "websocket"
	// wsV4Transport offers only v4: no way to close stdin, as older clients.
	wsV4Transport transport = "websocket-v4"
)

var transports = []transport{spdyTransport, wsTransport, wsV4Transport}

// stream runs one remotecommand session.
func stream(ctx context.Context, t *testing.T, rawURL string, tr transport, opts remotecommand.StreamOptions) error {
	t.Helper()
	var ex remotecommand.Executor
	var err error
	switch tr {
	case wsTransport:
		ex, err = remotecommand.NewWebSocketExecutor(&rest.Config{}, "GET", rawURL)
	case wsV4Transport:
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(&rest.Config{}, "GET", rawURL, "v4.channel.k8s.io")
	default:
		u, perr := url.Parse(rawURL)
		if perr != nil {
			t.Fatal(perr)
		}
		ex, err = remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	}
	if err != nil {
		t.Fatalf("executor: %v", err)
	}
	return ex.StreamWithContext(ctx, opts)
}

// fixedSize is a terminal size queue that reports one size, then ends.
type fixedSize struct {
	once sync.Once
	size remotecommand.TerminalSize
	done chan struct{}
}

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	first := false
	f.once.Do(func() { first = true })
	if first {
		return &f.size
	}
	<-f.done
	return nil
}

func countDir(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	return len(ents)
}

func TestE2EStreaming(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("stream")
	podID := e.runPod(ctx, pod)
	id := e.runCtr(ctx, podID, pod, ctrConfig("sleeper", img, "sleep", "3600"))

	t.Run("validation", func(t *testing.T) {
		for _, c := range []struct {
			req  *cri.ExecRequest
			code codes.Code
		}{
			{&cri.ExecRequest{ContainerId: "nope", Cmd: []string{"true"}, Stdout: true}, codes.NotFound},
			{&cri.ExecRequest{ContainerId: id, Cmd: []string{"true"}}, codes.InvalidArgument},
			{&cri.ExecRequest{ContainerId: id, Cmd: []string{"true"}, Tty: true, Stdout: true, Stderr: true}, codes.InvalidArgument},
			{&cri.ExecRequest{ContainerId: id, Stdout: true}, codes.InvalidArgument},
		} {
			if _, err := e.rt.Exec(ctx, c.req); status.Code(err) != c.code {
				t.Errorf("Exec %+v: %v, want %v", c.req, err, c.code)
			}
		}
		if _, err := e.rt.PortForward(ctx, &cri.PortForwardRequest{PodSandboxId: "nope", Port: []int32{80}}); status.Code(err) != codes.NotFound {
			t.Errorf("PortForward unknown pod: %v", err)
		}
		if _, err := e.rt.Attach(ctx, &cri.AttachRequest{ContainerId: "nope", Stdout: true}); status.Code(err) != codes.NotFound {
			t.Errorf("Attach unknown container: %v", err)
		}
	})

	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			var out, errOut bytes.Buffer
			u := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: []string{"sh", "-c", "echo hi; echo oops >&2"}, Stdout: true, Stderr: true})
			if err := stream(ctx, t, u, tr, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}); err != nil {
				t.Fatalf("echo: %v", err)
			}
			if out.String() != "hi\n" || errOut.String() != "oops\n" {
				t.Errorf("echo: stdout %q stderr %q", out.String(), errOut.String())
			}

			out.Reset()
			payload := strings.Repeat("round trip\n", 10000)
			cmd := []string{"cat"}
			if tr == wsV4Transport {
				// v4 cannot close stdin (the CLOSE frame is v5's), so cat would never
				// see EOF: read a known length instead.
				cmd = []string{"head", "-c", fmt.Sprint(len(payload))}
			}
			u = e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: cmd, Stdin: true, Stdout: true})
			if err := stream(ctx, t, u, tr, remotecommand.StreamOptions{Stdin: strings.NewReader(payload), Stdout: &out}); err != nil {
				t.Fatalf("%v: %v", cmd, err)
			}
			if out.String() != payload {
				t.Errorf("%v returned %d bytes, sent %d", cmd, out.Len(), len(payload))
			}

			u = e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: []string{"sh", "-c", "exit 7"}, Stdout: true})
			err := stream(ctx, t, u, tr, remotecommand.StreamOptions{Stdout: io.Discard})
			var ce clientexec.CodeExitError
			if !errors.As(err, &ce) || ce.Code != 7 {
				t.Errorf("exit 7: %T %v", err, err)
			}

			out.Reset()
			size := &fixedSize{size: remotecommand.TerminalSize{Width: 123, Height: 45}, done: make(chan struct{})}
			u = e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: []string{"sh", "-c", "sleep 0.5; stty size; tty"}, Tty: true, Stdout: true})
			err = stream(ctx, t, u, tr, remotecommand.StreamOptions{Stdout: &out, Tty: true, TerminalSizeQueue: size})
			close(size.done)
			if err != nil {
				t.Fatalf("tty: %v", err)
			}
			if got := strings.Fields(out.String()); len(got) != 3 || got[0] != "45" || got[1] != "123" || !strings.HasPrefix(got[2], "/dev/pts/") {
				t.Errorf("stty size after resize; tty: %q", out.String())
			}
		})
	}

	t.Run("portforward", func(t *testing.T) {
		e.runCtr(ctx, podID, pod, ctrConfig("httpd", img, "sh", "-c",
			"mkdir -p /tmp/www && echo hello-pf > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"))
		forward := func(port int32) (int, func()) { return e.portForward(ctx, t, podID, port) }
		// client-go ends the whole session on a refused connection, so forward only
		// once httpd listens.
		_, info := e.status(ctx, podID)
		waitListening(t, info.Pid, 8080)
		local, stop := forward(8080)
		defer stop()
		// The request carries data to the pod, the answer brings data back.
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", local))
		if err != nil {
			t.Fatalf("port-forward to httpd: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "hello-pf") {
			t.Fatalf("port-forward to httpd: %q", body)
		}

		// Several connections at once, each its own stream in the one session.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", local))
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "hello-pf") {
					errs <- fmt.Errorf("body %q", b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent port-forward: %v", err)
		}

		closedLocal, stopClosed := forward(9)
		defer stopClosed()
		c := &http.Client{Timeout: 10 * time.Second}
		if resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", closedLocal)); err == nil {
			resp.Body.Close()
			t.Errorf("closed port answered %s", resp.Status)
		}
	})

	t.Run("attach", func(t *testing.T) {
		cfg := ctrConfig("cat", img, "cat")
		cfg.Stdin = true
		catID := e.runCtr(ctx, podID, pod, cfg)

		// Two sessions at once, one per transport; each line typed into one reaches
		// the container's stdin, and cat's echo reaches both sessions and the log.
		type session struct {
			in   *io.PipeWriter
			out  *lineWaiter
			errc chan error
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var sessions []session
		for _, tr := range []transport{spdyTransport, wsTransport} {
			resp, err := e.rt.Attach(ctx, &cri.AttachRequest{ContainerId: catID, Stdin: true, Stdout: true})
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			pr, pw := io.Pipe()
			ss := session{in: pw, out: newLineWaiter(), errc: make(chan error, 1)}
			go func() {
				ss.errc <- stream(actx, t, resp.Url, tr, remotecommand.StreamOptions{Stdin: pr, Stdout: ss.out})
			}()
			sessions = append(sessions, ss)
		}
		for i, ss := range sessions {
			line := fmt.Sprintf("attached-hello-%d", i)
			// Until both sessions are connected a line may reach only some of them:
			// type it again until every session has seen it.
			seen := func() bool {
				for _, other := range sessions {
					if !other.out.wait(line, time.Second) {
						return false
					}
				}
				return true
			}
			for {
				_, _ = ss.in.Write([]byte(line + "\n"))
				if seen() {
					break
				}
				if actx.Err() != nil {
					t.Fatalf("attach: %q never reached every session: %q, %q", line, sessions[0].out.String(), sessions[1].out.String())
				}
			}
		}
		cancel()
		for _, ss := range sessions {
			ss.in.Close()
			<-ss.errc
		}
		// The sessions are gone; the container still runs, still reads its stdin
		// (nobody closed it) and its log holds what it echoed.
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: catID})
		if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("cat after attach sessions: %v %v", st, err)
		}
		logText := strings.Join(logLines(t, st.Status.LogPath), "\n")
		for i := range sessions {
			if !strings.Contains(logText, fmt.Sprintf("attached-hello-%d", i)) {
				t.Errorf("log lacks attached-hello-%d: %q", i, logText)
			}
		}
		// A terminal container: the attach carries its tty, and a resize reaches it.
		tcfg := ctrConfig("shell", img, "sh")
		tcfg.Stdin, tcfg.Tty = true, true
		shID := e.runCtr(ctx, podID, pod, tcfg)
		resp, err := e.rt.Attach(ctx, &cri.AttachRequest{ContainerId: shID, Stdin: true, Stdout: true, Tty: true})
		if err != nil {
			t.Fatalf("Attach tty: %v", err)
		}
		tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
		defer tcancel()
		s := startTTY(tctx, t, resp.Url, spdyTransport, 99, 33)
		s.askUntil(tctx, t, "tty attach", "echo tty-$((1+2)) $(stty size)", "tty-3 33 99", time.Second)
		// exit ends the shell, so the container and the session.
		if err := s.end(tctx, t, "tty attach", "exit"); err != nil {
			t.Errorf("tty attach ended with %v", err)
		}
		if st := e.waitExit(ctx, shID, 10*time.Second); st.ExitCode != 0 {
			t.Errorf("shell exit code %d", st.ExitCode)
		}

		if _, err := e.rt.Attach(ctx, &cri.AttachRequest{ContainerId: catID}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Attach without streams: %v", err)
		}
	})

	t.Run("leaks and latency", func(t *testing.T) {
		crisPid := e.cmd.Process.Pid
		crisFD, crisTask := fmt.Sprintf("/proc/%d/fd", crisPid), fmt.Sprintf("/proc/%d/task", crisPid)
		shimCounts := func() (fds, goroutines int) {
			_, info := e.status(ctx, podID)
			g, err := strconv.Atoi(info.Shim["goroutines"])
			if err != nil {
				t.Fatalf("shim goroutines in verbose status: %v (%v)", err, info.Shim)
			}
			return countDir(t, fmt.Sprintf("/proc/%d/fd", info.ShimPid)), g
		}
		run := func(i int) time.Duration {
			start := time.Now()
			var out bytes.Buffer
			u := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: []string{"echo", "hi"}, Stdout: true})
			if err := stream(ctx, t, u, spdyTransport, remotecommand.StreamOptions{Stdout: &out}); err != nil {
				t.Fatalf("exec %d: %v", i, err)
			}
			d := time.Since(start)
			if out.String() != "hi\n" {
				t.Fatalf("exec %d: %q", i, out.String())
			}
			return d
		}
		// One session first, so lazily created goroutines and fds are not counted.
		run(-1)
		time.Sleep(200 * time.Millisecond)
		shimFD0, shimG0 := shimCounts()
		fd0, task0 := countDir(t, crisFD), countDir(t, crisTask)
		const n = 500
		lat := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			lat = append(lat, run(i))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("echo exec round-trip over SPDY (Exec RPC + session), %d runs: p50 %v p99 %v", n, lat[n/2], lat[n*99/100])
		// The last sessions' fds and goroutines go after they returned: wait for the
		// counts to settle; a leak never does.
		var shimFD1, shimG1, fd1, task1 int
		settled := eventually(10*time.Second, func() bool {
			shimFD1, shimG1 = shimCounts()
			fd1, task1 = countDir(t, crisFD), countDir(t, crisTask)
			return shimFD1 <= shimFD0+2 && shimG1 <= shimG0+2 && fd1 <= fd0+5 && task1 <= task0+5
		})
		t.Logf("after %d execs: shim fds %d -> %d, shim goroutines %d -> %d, criserver fds %d -> %d, threads %d -> %d",
			n, shimFD0, shimFD1, shimG0, shimG1, fd0, fd1, task0, task1)
		if !settled {
			t.Errorf("leak after %d execs: shim fds %d -> %d, shim goroutines %d -> %d, criserver fds %d -> %d, threads %d -> %d",
				n, shimFD0, shimFD1, shimG0, shimG1, fd0, fd1, task0, task1)
		}
		for _, d := range []string{"exec", "attach"} {
			if ents, _ := os.ReadDir(filepath.Join(e.state, d)); len(ents) != 0 {
				t.Errorf("%s dirs left: %d", d, len(ents))
			}
		}
	})

	e.stopRemove(ctx, t, podID)
	if _, err := e.rt.Exec(ctx, &cri.ExecRequest{ContainerId: id, Cmd: []string{"true"}, Stdout: true}); status.Code(err) != codes.NotFound {
		t.Errorf("Exec in removed container: %v", err)
	}
	e.assertNodeClean(t)
}

// waitListening waits until a TCP socket listens on port in the network namespace of
// process pid.
func waitListening(t *testing.T, pid, port int) {
	t.Helper()
	// Local port, no peer, LISTEN; IPv4 or IPv6 (busybox nc -l binds ::).
	want4 := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	want6 := fmt.Sprintf(":%04X 00000000000000000000000000000000:0000 0A", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
		if err != nil {
			t.Fatalf("read sockets of pid %d: %v", pid, err)
		}
		b6, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp6", pid))
		if strings.Contains(string(b), want4) || strings.Contains(string(b6), want6) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on port %d in the pod:\n%s%s", port, b, b6)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lineWaiter collects a session's output and lets a test wait for a string in it.
type lineWaiter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newLineWaiter() *lineWaiter { return &lineWaiter{changed: make(chan struct{})} }

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	close(w.changed)
	w.changed = make(chan struct{})
	return len(p), nil
}

func (w *lineWaiter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// wait reports whether s appears in the output within d.
func (w *lineWaiter) wait(s string, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		w.mu.Lock()
		found, changed := strings.Contains(w.buf.String(), s), w.changed
		w.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}

// portForward forwards a free local port to port in the pod's network over SPDY; the
// returned func ends the session.
func (e *env) portForward(ctx context.Context, t *testing.T, podID string, port int32) (int, func()) {
	t.Helper()
	resp, err := e.rt.PortForward(ctx, &cri.PortForwardRequest{PodSandboxId: podID, Port: []int32{port}})
	if err != nil {
		t.Fatalf("PortForward: %v", err)
	}
	return forwardURL(t, resp.Url, port)
}

// forwardURL forwards a free local port to port over the port-forward session at
// rawURL (a CRI PortForward answer, from criserver or containerd).
func forwardURL(t *testing.T, rawURL string, port int32) (int, func()) {
	t.Helper()
	local, stop := forwardPorts(t, rawURL, []int32{port}, io.Discard)
	return int(local[0]), func() { _ = stop() }
}

// forwardPorts starts a client-go port-forward session (SPDY, as kubectl) at rawURL
// forwarding free local ports to ports, writing the session's errors to errOut. stop
// ends the session and returns what ForwardPorts returned.
func forwardPorts(t *testing.T, rawURL string, ports []int32, errOut io.Writer) (local []int32, stop func() error) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	tr, up, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var specs []string
	for _, p := range ports {
		specs = append(specs, fmt.Sprintf("0:%d", p))
	}
	stopCh, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(spdy.NewDialer(up, &http.Client{Transport: tr}, "POST", u),
		[]string{"127.0.0.1"}, specs, stopCh, ready, io.Discard, errOut)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ForwardPorts: %v", err)
	}
	fwd, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range fwd {
		local = append(local, int32(p.Local))
	}
	return local, func() error { close(stopCh); return <-done }
}
