package shimconformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Mode says how the suite drives the shim's pod.
type Mode string

// The two modes.
const (
	// ModeSandbox drives containerd.runtime.sandbox.v1.Sandbox (CreateSandbox,
	// StartSandbox) and then containers through the task API on the same socket.
	ModeSandbox Mode = "sandbox"
	// ModeTask drives a task-only shim as containerd's podsandbox does: a first
	// "sandbox" container holds the pod's namespaces, the others join it.
	ModeTask Mode = "task"
)

// DefaultTimeout bounds each capability's check unless Config.Timeout says otherwise.
const DefaultTimeout = 20 * time.Second

// Config says which shim to check and how.
type Config struct {
	// Shim is the path of the shim binary.
	Shim string
	// Mode is ModeSandbox (the default) or ModeTask.
	Mode Mode
	// Rootfs is a directory with a busybox (sh, sleep, cat, stty, head, tr) to use as
	// every container's read-only lower layer; empty builds one from /bin/busybox.
	Rootfs string
	// WorkDir holds the suite's bundles, sockets and FIFOs; empty means a new
	// temporary directory, removed at the end. A given one is emptied of what the
	// suite made, not removed.
	WorkDir string
	// TaskOptions goes into every CreateTaskRequest.Options and, as containerd sends
	// it, into BootstrapParams' extensions and the legacy start's stdin.
	TaskOptions *anypb.Any
	// Run selects the capabilities to check by name; nil checks all.
	Run *regexp.Regexp
	// Timeout bounds each check; zero means DefaultTimeout.
	Timeout time.Duration
	// Log, if set, receives progress lines.
	Log func(format string, args ...any)
}

// Capabilities lists every capability the suite knows, in the order it checks them.
func Capabilities() []string {
	return []string{
		"bootstrap.params", "bootstrap.legacy", "bootstrap.again", "bootstrap.info",
		"sandbox.create", "sandbox.start", "sandbox.status", "sandbox.ping", "sandbox.platform", "sandbox.metrics",
		"task.create", "task.start", "task.exit-code", "task.state", "task.pids", "task.kill", "task.kill-all",
		"task.exec", "task.tty", "task.stdin", "task.attach", "task.stats", "task.update", "task.pause",
		"task.oom", "task.delete", "events.order", "shim.reconnect",
		"sandbox.stop", "sandbox.wait", "sandbox.shutdown", "task.shutdown", "shim.delete",
	}
}

// pod is one shim with its sandbox: the sandbox's pid is what containers join.
type pod struct {
	id     string
	bundle string
	shim   *shimRun
	pid    int
	pause  *container // task mode: the sandbox container
	// containers are the pod's other containers, in the order they were created.
	containers []*container
}

// suite is one run.
type suite struct {
	cfg          Config
	dir          string
	lower        string
	namespace    string
	rand         string
	socketDir    string
	netns        string
	cgroupParent string
	events       *eventServer
	report       *Report

	mu       sync.Mutex
	seq      int
	cleanups []func()
	shims    []*shimRun

	main    *pod
	mainErr error
	podErr  error
	shared  map[string]*container
	logs    map[string]*collector
	shimIDs []string
}

// notSupported marks a check's outcome as "not supported" with its reason.
type notSupported struct{ reason string }

func (e notSupported) Error() string { return e.reason }

func unsupported(format string, args ...any) error {
	return notSupported{reason: fmt.Sprintf(format, args...)}
}

// isUnimplemented reports whether err is a ttrpc/gRPC Unimplemented status.
func isUnimplemented(err error) bool {
	return status.Code(errors.Unwrap(err)) == codes.Unimplemented || status.Code(err) == codes.Unimplemented ||
		strings.Contains(err.Error(), "code = Unimplemented") || strings.Contains(err.Error(), "not implemented")
}

func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || strings.Contains(err.Error(), "code = NotFound") || strings.Contains(err.Error(), "not found")
}

func (s *suite) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		s.cfg.Log(format, args...)
	}
}

func (s *suite) addCleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

func (s *suite) addShim(r *shimRun) {
	s.mu.Lock()
	s.shims = append(s.shims, r)
	s.shimIDs = append(s.shimIDs, r.id)
	s.mu.Unlock()
	s.addCleanup(r.kill)
}

func (s *suite) selected(name string) bool {
	return s.cfg.Run == nil || s.cfg.Run.MatchString(name)
}

// check runs one capability's check if it is selected (or always when force, for a
// step others need, recorded only if selected): in its own goroutine, bounded by the
// timeout, a panic turned into a failure.
func (s *suite) check(name string, force bool, fn func(ctx context.Context) error) error {
	sel := s.selected(name)
	if !sel && !force {
		return nil
	}
	start := time.Now()
	var detail string
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), detailKey{}, &detail), s.cfg.Timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		done <- fn(ctx)
	}()
	var err error
	finished := false
	select {
	case err = <-done:
		finished = true
	case <-ctx.Done():
		err = fmt.Errorf("timed out after %s", s.cfg.Timeout)
		// Give the check a moment to return after its context ended.
		select {
		case e := <-done:
			if e != nil {
				err = fmt.Errorf("timed out after %s: %w", s.cfg.Timeout, e)
			}
		case <-time.After(2 * time.Second):
		}
	}
	res := Result{Capability: name, Status: Pass, Duration: Duration(time.Since(start))}
	var ns notSupported
	switch {
	case err == nil:
	case errors.As(err, &ns):
		res.Status, res.Detail = Unsupported, ns.reason
	case isUnimplemented(err):
		res.Status, res.Detail = Unsupported, err.Error()
	default:
		res.Status, res.Detail = Fail, err.Error()
	}
	if err == nil && finished {
		res.Detail = detail
	}
	if sel {
		s.report.Results = append(s.report.Results, res)
		s.logf("%-4s %s %s %s", res.Status.Label(), name, time.Duration(res.Duration).Round(time.Millisecond), res.Detail)
	}
	return err
}

type detailKey struct{}

// Run checks the shim cfg names, capability by capability, and reports each one. The
// error is for a suite that could not run at all (bad config, no rootfs); a shim
// that fails is a Report with failures. Whatever the suite made (processes, mounts,
// the network namespace, cgroups, files) is removed before Run returns.
func Run(ctx context.Context, cfg Config) (_ *Report, retErr error) {
	if cfg.Shim == "" {
		return nil, errors.New("no shim given")
	}
	shim, err := filepath.Abs(cfg.Shim)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(shim); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("shim %s is not an executable file", cfg.Shim)
	}
	cfg.Shim = shim
	if cfg.Mode == "" {
		cfg.Mode = ModeSandbox
	}
	if cfg.Mode != ModeSandbox && cfg.Mode != ModeTask {
		return nil, fmt.Errorf("mode %q: want sandbox or task", cfg.Mode)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the suite runs containers and needs root")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := &suite{
		cfg:       cfg,
		namespace: "crisp-shimtest",
		rand:      hex.EncodeToString(b),
		report:    &Report{Shim: cfg.Shim, Mode: cfg.Mode},
		shared:    map[string]*container{},
		logs:      map[string]*collector{},
	}
	s.cgroupParent = "/crisp-shimtest-" + s.rand
	if cfg.WorkDir != "" {
		s.dir = filepath.Join(cfg.WorkDir, "cst-"+s.rand)
	} else {
		// Short: shim sockets live below it, and sun_path holds 108 bytes.
		s.dir = filepath.Join(os.TempDir(), "cst-"+s.rand)
	}
	if err := os.MkdirAll(s.dir, 0o711); err != nil {
		return nil, err
	}
	defer func() {
		if err := s.teardown(); err != nil && retErr == nil {
			retErr = err
		}
	}()
	if err := s.setup(); err != nil {
		return nil, err
	}
	s.report.Version = s.version(ctx)
	s.runChecks()
	return s.report, nil
}

func (s *suite) setup() error {
	// Shim sockets go in a short directory of their own whatever WorkDir is:
	// sun_path holds 108 bytes.
	s.socketDir = filepath.Join(os.TempDir(), "cst-s-"+s.rand)
	if err := os.MkdirAll(s.socketDir, 0o700); err != nil {
		return err
	}
	s.lower = s.cfg.Rootfs
	if s.lower == "" {
		s.lower = filepath.Join(s.dir, "lower")
		if err := makeBusyboxRootfs(s.lower); err != nil {
			return err
		}
	}
	var err error
	if s.events, err = startEventServer(filepath.Join(s.dir, "events.sock")); err != nil {
		return fmt.Errorf("events server: %w", err)
	}
	s.netns = filepath.Join(s.dir, "netns")
	if err := makeNetns(s.netns); err != nil {
		s.netns = ""
		return err
	}
	return nil
}

// teardown undoes everything: containers and shims in reverse order, then whatever is
// left in the suite's cgroups, mounts, network namespace and directory.
func (s *suite) teardown() error {
	s.mu.Lock()
	cleanups := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() { _ = recover() }()
			cleanups[i]()
		}()
	}
	var errs []error
	// A shim the suite lost track of (a start that spawned a second one).
	for _, id := range s.shimIDs {
		for _, pid := range s.shimPids(id) {
			errs = append(errs, fmt.Errorf("shim %s (pid %d) was still running at the end", id, pid))
			_ = killPid(pid)
		}
	}
	if err := removeCgroupTree(s.cgroupParent); err != nil {
		errs = append(errs, err)
	}
	if s.events != nil {
		s.events.close()
	}
	unmountUnder(s.dir)
	if s.netns != "" {
		if err := removeNetns(s.netns); err != nil {
			errs = append(errs, fmt.Errorf("netns: %w", err))
		}
	}
	if s.socketDir != "" {
		if err := os.RemoveAll(s.socketDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		s.logf("cleanup: %v", errors.Join(errs...))
	}
	// Only what could not be removed is an error of Run; a leftover shim the suite
	// killed is reported in the log.
	var hard []error
	for _, e := range errs {
		if !strings.Contains(e.Error(), "still running at the end") {
			hard = append(hard, e)
		}
	}
	return errors.Join(hard...)
}

// version asks the shim's -info, then --version and -v.
func (s *suite) version(ctx context.Context) string {
	if info, err := s.runInfo(ctx); err == nil {
		if v := info.GetVersion(); v != nil && v.GetVersion() != "" {
			if v.GetRevision() != "" {
				return v.GetVersion() + " (" + v.GetRevision() + ")"
			}
			return v.GetVersion()
		}
	}
	for _, flag := range []string{"--version", "-v"} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := exec.CommandContext(cctx, s.cfg.Shim, flag).Output()
		cancel()
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for _, l := range lines {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "Version:" {
				return f[1]
			}
		}
		if len(lines) > 0 && lines[0] != "" {
			return strings.TrimSpace(lines[0])
		}
	}
	return ""
}

func (s *suite) runInfo(ctx context.Context) (*types.RuntimeInfo, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, s.cfg.Shim, "-info")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, unsupported("-info: %v: %s", err, firstLine(stderr.String()))
	}
	var info types.RuntimeInfo
	if err := proto.Unmarshal(stdout.Bytes(), &info); err != nil {
		return nil, fmt.Errorf("-info printed no RuntimeInfo: %w", err)
	}
	return &info, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// setDetail records what a passing check measured.
func setDetail(ctx context.Context, format string, args ...any) {
	if d, ok := ctx.Value(detailKey{}).(*string); ok {
		*d = fmt.Sprintf(format, args...)
	}
}

// needMain fails a check that needs the pod's shim when it did not start.
func (s *suite) needMain() error {
	if s.mainErr != nil {
		return fmt.Errorf("not checked: the shim did not start (bootstrap.params: %v)", s.mainErr)
	}
	return nil
}

// needPod fails a check that needs the pod when it is not running.
func (s *suite) needPod() error {
	if err := s.needMain(); err != nil {
		return err
	}
	if s.podErr != nil {
		return fmt.Errorf("not checked: the pod did not start: %v", s.podErr)
	}
	return nil
}

// processSpec is an exec's process: the container's with other args.
func processSpec(c *container, terminal bool, args ...string) (*anypb.Any, error) {
	p := *c.spec.Process
	p.Args = args
	p.Terminal = terminal
	data, err := jsonMarshal(&p)
	if err != nil {
		return nil, err
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: data}, nil
}

func waitExit(ctx context.Context, t *taskClient, id, execID string) (*taskapi.WaitResponse, error) {
	resp, err := t.Wait(ctx, id, execID)
	if err != nil {
		return nil, fmt.Errorf("wait %s %s: %w", id, execID, err)
	}
	return resp, nil
}
