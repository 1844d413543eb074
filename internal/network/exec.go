package network

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// DefaultTimeout bounds one CNI operation (the ADD or the DEL of a pod's network list)
// when Config.Timeout is zero. kubelet gives RunPodSandbox 4 minutes and
// StopPodSandbox 2 (twice and once its runtime-request-timeout); a minute leaves
// room for the rest of either call and for the DEL that undoes a failed ADD, and is
// what CRI-O gives its network teardown. Healthy plugins take milliseconds; one that
// waits on an unreachable datastore (calico, cilium) gives up well within it.
const DefaultTimeout = time.Minute

// DefaultCancelGrace is Config.CancelGrace when it is zero: healthy plugins finish an
// ADD in milliseconds, and one waiting on a datastore gets a few seconds more.
const DefaultCancelGrace = 5 * time.Second

// pluginWaitDelay is how long a killed plugin's output pipes may stay open (held by
// a process that escaped the kill) before the call returns anyway.
const pluginWaitDelay = 2 * time.Second

// TimeoutError is a CNI operation that ran past the configured timeout. The plugin
// running at that moment was killed, with everything it had started.
type TimeoutError struct {
	Plugin  string        // plugin binary that was running
	Command string        // CNI_COMMAND: ADD, DEL
	Timeout time.Duration // cni.timeout_seconds
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("CNI plugin %s was killed in %s: the network's %s did not finish within %s (cni.timeout_seconds)",
		e.Plugin, e.Command, e.Command, e.Timeout)
}

// Is makes a timeout a context.DeadlineExceeded, so that the CRI reports it as such.
func (e *TimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// timeoutCause marks a context that ended because of the CNI timeout rather than
// because the caller gave up.
type timeoutCause struct{ d time.Duration }

func (c *timeoutCause) Error() string { return fmt.Sprintf("CNI timeout of %s", c.d) }

// withTimeout bounds one CNI operation; plugins killed at its deadline report a
// TimeoutError.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, &timeoutCause{d})
}

// withCallerGrace bounds an ADD by the CNI timeout d, and by the caller's context only
// grace after the caller gave up: a plugin killed at once would be killed wherever it
// is, maybe between reserving an address and recording whose it is. The ADD ends
// with the cause the caller's context ended with, so that it still reads as the
// caller's cancel (or deadline), not as a CNI timeout.
func withCallerGrace(ctx context.Context, d, grace time.Duration) (context.Context, context.CancelFunc) {
	inner, cancelInner := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelInner(context.Cause(ctx))
		case <-inner.Done():
		}
	})
	tctx, cancelT := withTimeout(inner, d)
	return tctx, func() {
		stop()
		cancelT()
		cancelInner(context.Canceled)
	}
}

// pluginExec runs CNI plugins like libcni's RawExec, but so that a deadline really
// ends the call: the plugin runs in a process group of its own and the whole group is
// killed, and the call does not wait for output pipes held open by a process that
// escaped. RawExec kills only the plugin itself and then waits for its stdout to
// close, which a shell-script plugin's child (a sleep, a stuck iptables) keeps open,
// so the timeout would not bound anything.
type pluginExec struct {
	stderr  io.Writer // what succeeding plugins print on stderr
	decoder version.PluginDecoder
}

var _ invoke.Exec = (*pluginExec)(nil)

// ExecPlugin runs one plugin with stdin and environ and returns its stdout, in a span
// of its own: libcni calls it once per plugin of the list, with the context of the
// operation's span.
func (e *pluginExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	ctx, span := tracing.Start(ctx, spanPlugin)
	out, err := e.execPlugin(ctx, pluginPath, stdinData, environ)
	if span.IsRecording() {
		setPluginAttrs(span, pluginPath, environ, out, err)
	}
	tracing.End(span, err)
	return out, err
}

func (e *pluginExec) execPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	var err error
	// A plugin binary being replaced is briefly busy; libcni retries that too.
	for attempt := 1; ; attempt++ {
		stdout.Reset()
		stderr.Reset()
		err = runPlugin(ctx, pluginPath, stdinData, environ, &stdout, &stderr)
		if !errors.Is(err, syscall.ETXTBSY) || attempt == 5 || !sleepCtx(ctx, time.Second) {
			break
		}
	}
	if errors.Is(err, exec.ErrWaitDelay) && ctx.Err() == nil {
		// The plugin exited 0 and its output is complete; something it started still
		// holds the pipe, which RawExec would have waited for forever.
		err = nil
	}
	if err == nil {
		if e.stderr != nil && stderr.Len() > 0 {
			_, _ = stderr.WriteTo(e.stderr)
		}
		return stdout.Bytes(), nil
	}
	if ctx.Err() != nil {
		return nil, contextErr(ctx, pluginPath, environ)
	}
	return nil, pluginErr(err, stdout.Bytes(), stderr.Bytes())
}

// runPlugin runs the plugin to completion, or kills its process group when ctx ends.
func runPlugin(ctx context.Context, path string, stdin []byte, environ []string, stdout, stderr io.Writer) error {
	c := exec.CommandContext(ctx, path)
	c.Env = environ
	c.Stdin = bytes.NewReader(stdin)
	c.Stdout, c.Stderr = stdout, stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error {
		// The group's id is the plugin's pid; Wait still reaps the plugin itself.
		return syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	c.WaitDelay = pluginWaitDelay
	return c.Run()
}

// contextErr says why a plugin was stopped: the CNI timeout, or the caller giving up.
func contextErr(ctx context.Context, path string, environ []string) error {
	cmd := envValue(environ, "CNI_COMMAND")
	var tc *timeoutCause
	if errors.As(context.Cause(ctx), &tc) {
		return &TimeoutError{Plugin: filepath.Base(path), Command: cmd, Timeout: tc.d}
	}
	// The cause: a caller's deadline stays a deadline after the grace (withCallerGrace).
	return fmt.Errorf("CNI plugin %s was killed in %s: %w", filepath.Base(path), cmd, context.Cause(ctx))
}

// pluginErr is libcni's RawExec error for a plugin that failed: the CNI error the
// plugin printed, or what it wrote to stderr.
func pluginErr(err error, stdout, stderr []byte) error {
	emsg := types.Error{}
	switch {
	case len(stdout) > 0:
		if perr := json.Unmarshal(stdout, &emsg); perr != nil {
			emsg.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", string(stdout), perr)
		}
	case len(stderr) > 0:
		emsg.Msg = fmt.Sprintf("netplugin failed: %q: %v", string(stderr), err)
	default:
		emsg.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	}
	return &emsg
}

// FindInPath finds a plugin binary in paths.
func (e *pluginExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

// Decode parses a plugin's VERSION answer.
func (e *pluginExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return e.decoder.Decode(jsonBytes)
}

// sleepCtx sleeps for d unless ctx ends first; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// timedOutPlugin returns the plugin a TimeoutError in err names, or "".
func timedOutPlugin(err error) string {
	var te *TimeoutError
	if errors.As(err, &te) {
		return te.Plugin
	}
	return ""
}
