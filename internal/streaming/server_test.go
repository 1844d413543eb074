package streaming

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	clientexec "k8s.io/client-go/util/exec"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"
)

// catRuntime is a Runtime whose "container" copies stdin to stdout, and whose
// command, if it is "exit N", exits N after that. It records what each session saw.
type catRuntime struct {
	mu       sync.Mutex
	sessions []sessionSeen
	ended    chan struct{}
}

type sessionSeen struct {
	container       string
	in, out, errw   bool
	tty             bool
	endedByCtx      bool
	resizes         []TerminalSize
	resizeWasNonNil bool
}

func newCatRuntime() *catRuntime { return &catRuntime{ended: make(chan struct{}, 100)} }

func (c *catRuntime) record(s sessionSeen) {
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	c.ended <- struct{}{}
}

func (c *catRuntime) last(t *testing.T) sessionSeen {
	t.Helper()
	select {
	case <-c.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("session did not end")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[len(c.sessions)-1]
}

func (c *catRuntime) Exec(ctx context.Context, id string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan TerminalSize) error {
	seen := sessionSeen{container: id, in: in != nil, out: out != nil, errw: errw != nil, tty: tty, resizeWasNonNil: resize != nil}
	defer func() { c.record(seen) }()
	if resize != nil {
		// The client sends its size first; take that one.
		select {
		case sz := <-resize:
			seen.resizes = append(seen.resizes, sz)
		case <-time.After(5 * time.Second):
		}
	}
	if in != nil {
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			if out != nil {
				_, _ = io.Copy(out, in)
			} else {
				_, _ = io.Copy(io.Discard, in)
			}
		}()
		select {
		case <-copied:
		case <-ctx.Done():
			seen.endedByCtx = true
			return ctx.Err()
		}
	} else if len(cmd) == 1 && cmd[0] == "wait" {
		<-ctx.Done()
		seen.endedByCtx = true
		return ctx.Err()
	}
	if errw != nil {
		fmt.Fprint(errw, "to stderr")
	}
	var code int
	if n, _ := fmt.Sscanf(strings.Join(cmd, " "), "exit %d", &code); n == 1 && code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("exit %d", code), Code: code}
	}
	if len(cmd) == 1 && cmd[0] == "fail" {
		return errors.New("runtime failure")
	}
	return nil
}

func (c *catRuntime) Attach(ctx context.Context, id string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan TerminalSize) error {
	return c.Exec(ctx, id, nil, in, out, errw, tty, resize)
}

func (c *catRuntime) PortForward(ctx context.Context, pod string, port int32, stream io.ReadWriteCloser) error {
	return errors.New("not used")
}

func newTestServer(t *testing.T, rt Runtime, cfg Config) *Server {
	t.Helper()
	cfg.Address = "127.0.0.1"
	s, err := New(cfg, rt, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return s
}

func executor(t *testing.T, rawURL, tr string) remotecommand.Executor {
	t.Helper()
	var ex remotecommand.Executor
	var err error
	switch tr {
	case "spdy":
		u, perr := url.Parse(rawURL)
		if perr != nil {
			t.Fatal(perr)
		}
		ex, err = remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	case "ws":
		ex, err = remotecommand.NewWebSocketExecutor(&rest.Config{}, "GET", rawURL)
	default:
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(&rest.Config{}, "GET", rawURL, tr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

func TestExecOverEveryProtocol(t *testing.T) {
	rt := newCatRuntime()
	s := newTestServer(t, rt, Config{})
	ctx := context.Background()
	// client-go speaks neither the base64 nor the pre-v4 websocket protocols.
	for _, tr := range []string{"spdy", "ws", "v4.channel.k8s.io"} {
		t.Run(tr, func(t *testing.T) {
			closesStdin := tr == "spdy" || tr == "ws"
			if closesStdin {
				resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"exit", "0"}, Stdin: true, Stdout: true, Stderr: true})
				if err != nil {
					t.Fatal(err)
				}
				var out, errOut bytes.Buffer
				err = executor(t, resp.Url, tr).StreamWithContext(ctx, remotecommand.StreamOptions{
					Stdin: strings.NewReader("ping"), Stdout: &out, Stderr: &errOut,
				})
				if err != nil || out.String() != "ping" || errOut.String() != "to stderr" {
					t.Errorf("cat: %v, stdout %q, stderr %q", err, out.String(), errOut.String())
				}
				if got := rt.last(t); !got.in || !got.out || !got.errw || got.container != "c1" || got.resizeWasNonNil {
					t.Errorf("runtime saw %+v", got)
				}
			}

			// Streams the client did not ask for reach the runtime as nil.
			resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c2", Cmd: []string{"exit", "7"}, Stdout: true})
			if err != nil {
				t.Fatal(err)
			}
			err = executor(t, resp.Url, tr).StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard})
			var ce clientexec.CodeExitError
			if !errors.As(err, &ce) || ce.Code != 7 {
				t.Errorf("exit 7: %T %v", err, err)
			}
			if got := rt.last(t); got.in || !got.out || got.errw {
				t.Errorf("runtime saw %+v for a stdout-only exec", got)
			}

			resp, err = s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c3", Cmd: []string{"fail"}, Stdout: true})
			if err != nil {
				t.Fatal(err)
			}
			err = executor(t, resp.Url, tr).StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard})
			if err == nil || !strings.Contains(err.Error(), "runtime failure") {
				t.Errorf("runtime failure reached the client as %v", err)
			}
			rt.last(t)
		})
	}
}

type oneSize struct {
	once sync.Once
	size remotecommand.TerminalSize
	done chan struct{}
}

func (o *oneSize) Next() *remotecommand.TerminalSize {
	first := false
	o.once.Do(func() { first = true })
	if first {
		return &o.size
	}
	<-o.done
	return nil
}

func TestTTYResize(t *testing.T) {
	rt := newCatRuntime()
	s := newTestServer(t, rt, Config{})
	for _, tr := range []string{"spdy", "ws"} {
		resp, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c", Tty: true, Stdout: true})
		if err != nil {
			t.Fatal(err)
		}
		q := &oneSize{size: remotecommand.TerminalSize{Width: 80, Height: 24}, done: make(chan struct{})}
		err = executor(t, resp.Url, tr).StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: io.Discard, Tty: true, TerminalSizeQueue: q})
		close(q.done)
		if err != nil {
			t.Fatalf("%s: %v", tr, err)
		}
		got := rt.last(t)
		if !got.tty || got.in || len(got.resizes) != 1 || got.resizes[0] != (TerminalSize{Width: 80, Height: 24}) {
			t.Errorf("%s: runtime saw %+v", tr, got)
		}
	}
}

func TestTokens(t *testing.T) {
	rt := newCatRuntime()
	s := newTestServer(t, rt, Config{TokenTTL: 200 * time.Millisecond, MaxPending: 2})
	resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c", Cmd: []string{"exit", "0"}, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := executor(t, resp.Url, "spdy").StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: io.Discard}); err != nil {
		t.Fatal(err)
	}
	rt.last(t)

	get := func(u string) int {
		t.Helper()
		r, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if code := get(resp.Url); code != http.StatusNotFound {
		t.Errorf("reused token: %d", code)
	}
	if code := get(s.URL() + "/exec/nonsense"); code != http.StatusNotFound {
		t.Errorf("unknown token: %d", code)
	}
	// A token works only on the path of its kind.
	pf, err := s.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: "p", Port: []int32{80}})
	if err != nil {
		t.Fatal(err)
	}
	if code := get(strings.Replace(pf.Url, "/portforward/", "/exec/", 1)); code != http.StatusNotFound {
		t.Errorf("port-forward token on the exec path: %d", code)
	}

	// The cache holds MaxPending URLs, expired ones make room.
	if _, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c", Stdout: true}); err != nil {
		t.Fatal(err)
	}
	a2, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c", Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c", Stdout: true}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("third pending URL with MaxPending 2: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if code := get(a2.Url); code != http.StatusNotFound {
		t.Errorf("expired token: %d", code)
	}
	if _, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c", Stdout: true}); err != nil {
		t.Errorf("after expiry: %v", err)
	}
}

// A client that disappears ends the session's context, even when the session neither
// reads nor writes anything.
func TestClientGoneEndsSession(t *testing.T) {
	rt := newCatRuntime()
	s := newTestServer(t, rt, Config{})
	for _, tr := range []string{"spdy", "ws"} {
		resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c", Cmd: []string{"wait"}, Stdout: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			errc <- executor(t, resp.Url, tr).StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard})
		}()
		time.Sleep(300 * time.Millisecond)
		cancel()
		<-errc
		if got := rt.last(t); !got.endedByCtx {
			t.Errorf("%s: session ended without its context: %+v", tr, got)
		}
	}
}
