package pause

// The constructor in pause.c is linked into every binary that imports this package.

// #cgo CFLAGS: -Wall -O2
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	"golang.org/x/sys/unix"
)

// Environment of the re-executed binary understood by pause.c.
const (
	envPause    = "_CRISP_PAUSE"
	envNetNS    = "_CRISP_NETNS"
	envHostname = "_CRISP_HOSTNAME"
	envSysctls  = "_CRISP_SYSCTLS"
	// envUserNSOfNetNS names a network namespace whose owning user namespace the
	// process joins (then the netns itself); envUnshare the namespaces it then creates.
	envUserNSOfNetNS = "_CRISP_USERNS_OF_NETNS"
	envUnshare       = "_CRISP_UNSHARE"
	// envOOMScoreAdj is the process's oom_score_adj, which it writes itself first.
	envOOMScoreAdj = "_CRISP_OOM_SCORE_ADJ"
	// envSELinuxLabel is the label the process takes once its namespaces are in place.
	envSELinuxLabel = "_CRISP_SELINUX_LABEL"
)

// DefaultReadyTimeout bounds how long Start waits for the pause process to report.
const DefaultReadyTimeout = 10 * time.Second

// Runner starts and waits for commands; the shim's reaper implements it so that it
// never reaps the pause process behind Wait's back.
type Runner interface {
	Start(*exec.Cmd) error
	Wait(*exec.Cmd) error
}

// Adopter is a Runner that can also hand over a child the shim did not start itself
// (the shim's reaper): the init of the pod's PID namespace when the pause process
// joins an existing user namespace is forked by the started process, as the shim's
// sibling-made child. Adopt is called before the start; its claim, once the pid is
// known, reports the exit status if the child was already reaped and otherwise keeps
// the reaper off it until Forget, after the wait; done ends the adoption.
type Adopter interface {
	Runner
	Adopt() (claim func(pid int) (unix.WaitStatus, bool), done func())
	Forget(pid int)
}

type directRunner struct{}

func (directRunner) Start(c *exec.Cmd) error { return c.Start() }
func (directRunner) Wait(c *exec.Cmd) error  { return c.Wait() }

// Config describes the namespaces the pause process creates or joins.
type Config struct {
	// NetNSPath is a network namespace file to join; empty keeps the shim's (host) one.
	NetNSPath string
	// Hostname is set in the new UTS namespace; it must be empty unless NewUTS.
	Hostname string
	// Sysctls are written after joining the namespaces (keys like "net.ipv4.ip_forward").
	Sysctls map[string]string
	// NewIPC, NewUTS and NewPID unshare the corresponding namespaces.
	NewIPC, NewUTS, NewPID bool
	// NewNet gives the process a new network namespace (NetNSPath must be empty).
	NewNet bool
	// UserNS, when set, puts the process in a new user namespace with these mappings.
	// It is created first, in the same clone, so it owns every other new namespace:
	// the pod's root can then mount sysfs and proc, and set the pod's sysctls.
	UserNS *IDMap
	// JoinUserNS, with NetNSPath, instead joins the user namespace that owns that
	// network namespace (containerd creates a user-namespaced pod's netns inside the
	// pod's user namespace) and creates the new IPC, UTS and PID namespaces inside it.
	// The PID namespace's init is then forked by the started process; the Runner
	// should be an Adopter, so that the shim's reaper leaves it alone.
	JoinUserNS bool
	// ReadyTimeout defaults to DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Executable defaults to /proc/self/exe, which carries the constructor.
	Executable string
	// SELinuxLabel, when set, is the process label the pause takes (the pod's) once
	// it has set up the pod's namespaces, hostname and sysctls, before it reports
	// ready: a dynamic transition (setcon), not one at the exec as runc gives a
	// container its label, because the container policies let the pod's type enter
	// only files of the pod's file type, which the shim's binary is not, and because
	// what the pause sets up needs the shim's domain. If the policy refuses the
	// transition the pause keeps the shim's domain (Label tells).
	SELinuxLabel string
	// OOMScoreAdj, when set, is the process's oom_score_adj. The process writes it
	// itself before anything else: in the pod's SELinux label the shim's domain may no
	// longer write the process's /proc files. It must not be below the shim's own
	// (lowering needs CAP_SYS_RESOURCE; proc.ClampOOMScoreAdj).
	OOMScoreAdj *int
	// Runner defaults to exec.Cmd's own Start and Wait.
	Runner Runner
}

// IDMap is a user namespace's mapping: container id 0 onwards to host ids.
type IDMap struct {
	UID, GID Range
}

// Range maps Size ids from container id 0 to HostID onwards.
type Range struct {
	HostID, Size uint32
}

// Process is a running (or exited) pause process.
type Process struct {
	pid       int
	startedAt time.Time
	proc      *os.Process
	// waitFn waits for the process and returns its state.
	waitFn func() *os.ProcessState
	done   chan struct{}

	mu         sync.Mutex
	exitStatus uint32
	exitedAt   time.Time
}

// Start starts the pause process and returns once it reported that its namespaces,
// hostname and sysctls are in place.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	env, err := environ(cfg)
	if err != nil {
		return nil, err
	}
	runner := cfg.Runner
	if runner == nil {
		runner = directRunner{}
	}
	exe := cfg.Executable
	if exe == "" {
		exe = "/proc/self/exe"
	}
	timeout := cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}

	if cfg.JoinUserNS {
		return startJoined(ctx, cfg, env, runner, exe, timeout)
	}
	flags := cfg.unshareFlags()
	if cfg.NewNet {
		if cfg.NetNSPath != "" {
			return nil, errors.New("pause: a new network namespace and a netns path to join exclude each other")
		}
		flags |= unix.CLONE_NEWNET
	}
	attr := &syscall.SysProcAttr{Cloneflags: uintptr(flags)}
	if u := cfg.UserNS; u != nil {
		// clone(CLONE_NEWUSER|...) creates the user namespace before the others, so
		// they are owned by it. Go writes uid_map and gid_map from this (root) process
		// before the child runs on. setgroups stays allowed: the decision is made once
		// per user namespace, and the containers that join it later call setgroups(2)
		// for their supplemental groups.
		attr.Cloneflags |= unix.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.UID.HostID), Size: int(u.UID.Size)}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.GID.HostID), Size: int(u.GID.Size)}}
		attr.GidMappingsEnableSetgroups = true
		// The child keeps the shim's kuid 0 unless told otherwise, and that is not
		// mapped in the new namespace: execve would then drop every capability. So it
		// becomes the namespace's root (and drops the host's supplementary groups).
		attr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
		if attr.Cloneflags&unix.CLONE_NEWIPC != 0 {
			// The IPC namespace is made by the process itself once it is the user
			// namespace's root (pause.c). Made in the clone, its mqueue filesystem
			// belongs to the shim's host root, which the namespace does not map, and
			// a container's /dev/mqueue then cannot take its SELinux label
			// ("setxattr ... operation not permitted": runc #4466).
			attr.Cloneflags &^= unix.CLONE_NEWIPC
			env = append(env, envUnshare+"="+strconv.Itoa(unix.CLONE_NEWIPC))
		}
	}
	p, r, err := startProcess(runner, exe, env, attr)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := p.awaitReady(ctx, r, timeout); err != nil {
		return nil, err
	}
	return p, nil
}

// unshareFlags returns the CLONE_NEW* flags of the IPC, UTS and PID namespaces cfg
// asks for.
func (cfg Config) unshareFlags() int {
	var flags int
	if cfg.NewIPC {
		flags |= unix.CLONE_NEWIPC
	}
	if cfg.NewUTS {
		flags |= unix.CLONE_NEWUTS
	}
	if cfg.NewPID {
		flags |= unix.CLONE_NEWPID
	}
	return flags
}

// startProcess starts exe as crisp-pause with env and attr, the write end of a new
// ready pipe as its fd 3, and returns the Process, waited for through runner, with
// the pipe's read end for the caller to read the report from and close.
func startProcess(runner Runner, exe string, env []string, attr *syscall.SysProcAttr) (*Process, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pause ready pipe: %w", err)
	}
	// Setsid detaches it from the shim's session so it outlives the shim (kept for
	// recovery); no Pdeathsig for the same reason.
	attr.Setsid = true
	cmd := &exec.Cmd{
		Path: exe,
		Args: []string{"crisp-pause"},
		Env:  env,
		// Not the bundle: a cwd there would keep the bundle's mount busy.
		Dir:         "/",
		ExtraFiles:  []*os.File{w},
		SysProcAttr: attr,
	}
	err = runner.Start(cmd)
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, nil, fmt.Errorf("start pause process: %w", err)
	}
	p := &Process{pid: cmd.Process.Pid, startedAt: time.Now(), proc: cmd.Process, done: make(chan struct{})}
	p.waitFn = func() *os.ProcessState {
		// The error only repeats the exit status, which ProcessState carries.
		_ = runner.Wait(cmd)
		return cmd.ProcessState
	}
	go p.wait()
	return p, r, nil
}

// awaitReady waits for p's report on the ready pipe r; if it is not "ok", p is killed
// and reaped before the error is returned.
func (p *Process) awaitReady(ctx context.Context, r *os.File, timeout time.Duration) error {
	if err := readReady(ctx, r, timeout); err != nil {
		_ = p.Signal(unix.SIGKILL)
		<-p.done
		return err
	}
	return nil
}

// startJoined starts a pause process that joins the user namespace owning
// cfg.NetNSPath. The started process joins it and the netns, unshares the other
// namespaces and, for a new PID namespace, forks the pause process proper (the
// shim's child through CLONE_PARENT), reports its pid and exits.
func startJoined(ctx context.Context, cfg Config, env []string, runner Runner, exe string, timeout time.Duration) (*Process, error) {
	if cfg.NetNSPath == "" || cfg.NewNet || cfg.UserNS != nil {
		return nil, errors.New("pause: joining a user namespace needs a netns path, and no new network or user namespace")
	}
	flags := cfg.unshareFlags()
	// The C code joins the netns itself, after the user namespace.
	env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, envNetNS+"=") })
	env = append(env, envUserNSOfNetNS+"="+cfg.NetNSPath, envUnshare+"="+strconv.Itoa(flags))

	adopter, _ := runner.(Adopter)
	var adopt func(int) (unix.WaitStatus, bool)
	if adopter != nil {
		var done func()
		adopt, done = adopter.Adopt()
		defer done()
	}
	starter, r, err := startProcess(runner, exe, env, &syscall.SysProcAttr{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if !cfg.NewPID {
		// No fork: the started process is the pause process.
		if err := starter.awaitReady(ctx, r, timeout); err != nil {
			return nil, err
		}
		return starter, nil
	}

	// "pid:N\n" from the starter, then the pause process's own report.
	if err := r.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("pause ready pipe deadline: %w", err)
	}
	line, err := readLine(r)
	if err != nil {
		_ = starter.Signal(unix.SIGKILL)
	}
	<-starter.done
	status, _, _ := starter.Exited()
	pidText, ok := strings.CutPrefix(line, "pid:")
	pid, perr := strconv.Atoi(pidText)
	if !ok || perr != nil || pid <= 0 {
		// Without a pid the starter failed: what it wrote is its error.
		msg := strings.TrimSpace(line)
		if msg == "" {
			msg = fmt.Sprintf("exited without reporting (%v)", err)
		}
		return nil, fmt.Errorf("pause process (starter exit status %d): %s", status, msg)
	}
	if status != 0 {
		return nil, fmt.Errorf("pause process starter exited with status %d after forking %d", status, pid)
	}
	p := &Process{pid: pid, startedAt: time.Now(), done: make(chan struct{})}
	if adopt != nil {
		if ws, reaped := adopt(pid); reaped {
			return nil, fmt.Errorf("pause process %d exited at once (%s); it said: %s", pid, describe(ws), readRest(r))
		}
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil, fmt.Errorf("pause process %d: %w", pid, err)
	}
	p.proc = proc
	p.waitFn = func() *os.ProcessState {
		st, _ := proc.Wait()
		if adopter != nil {
			adopter.Forget(pid)
		}
		return st
	}
	go p.wait()
	if err := p.awaitReady(ctx, r, timeout); err != nil {
		return nil, err
	}
	return p, nil
}

// readLine reads up to a newline (or the end: an error report has none), a byte at a
// time, so that nothing after it is consumed.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	buf := make([]byte, 1)
	for b.Len() < 4096 {
		n, err := r.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				return b.String(), nil
			}
			b.WriteByte(buf[0])
		}
		if err != nil {
			return b.String(), err
		}
	}
	return b.String(), errors.New("pause process: report line too long")
}

// readRest returns what is left in the ready pipe (an error message), best effort.
func readRest(r *os.File) string {
	_ = r.SetReadDeadline(time.Now().Add(time.Second))
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	return string(msg)
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}

func readReady(ctx context.Context, r *os.File, timeout time.Duration) error {
	if err := r.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("pause ready pipe deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = r.SetReadDeadline(time.Now()) })
	defer stop()
	msg, err := io.ReadAll(io.LimitReader(r, 4096))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for pause process: %w", ctx.Err())
		}
		return fmt.Errorf("waiting for pause process (timeout %s): %w", timeout, err)
	}
	switch s := string(msg); s {
	case "ok":
		return nil
	case "":
		return errors.New("pause process exited without reporting readiness")
	default:
		return fmt.Errorf("pause process: %s", s)
	}
}

func environ(cfg Config) ([]string, error) {
	env := []string{envPause + "=1"}
	if cfg.NetNSPath != "" {
		env = append(env, envNetNS+"="+cfg.NetNSPath)
	}
	if cfg.Hostname != "" {
		if !cfg.NewUTS {
			return nil, errors.New("pause: a hostname needs a new UTS namespace")
		}
		env = append(env, envHostname+"="+cfg.Hostname)
	}
	if len(cfg.Sysctls) > 0 {
		keys := make([]string, 0, len(cfg.Sysctls))
		for k := range cfg.Sysctls {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			v := cfg.Sysctls[k]
			// One line per sysctl in the environment: a newline or '=' in the key
			// would let one entry smuggle another.
			if k == "" || strings.ContainsAny(k, "=\n\x00") || strings.ContainsAny(v, "\n\x00") {
				return nil, fmt.Errorf("pause: invalid sysctl %q=%q", k, v)
			}
			b.WriteString(k + "=" + v + "\n")
		}
		env = append(env, envSysctls+"="+b.String())
	}
	if cfg.OOMScoreAdj != nil {
		env = append(env, envOOMScoreAdj+"="+strconv.Itoa(*cfg.OOMScoreAdj))
	}
	if cfg.SELinuxLabel != "" {
		if strings.ContainsAny(cfg.SELinuxLabel, "\n\x00") {
			return nil, fmt.Errorf("pause: invalid SELinux label %q", cfg.SELinuxLabel)
		}
		env = append(env, envSELinuxLabel+"="+cfg.SELinuxLabel)
	}
	return env, nil
}

func (p *Process) wait() {
	var status uint32
	if st := p.waitFn(); st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status = 128 + uint32(ws.Signal())
		} else {
			status = uint32(st.ExitCode())
		}
	}
	p.mu.Lock()
	p.exitStatus, p.exitedAt = status, time.Now()
	p.mu.Unlock()
	close(p.done)
}

// Pid returns the pause process's pid in the shim's PID namespace.
func (p *Process) Pid() int { return p.pid }

// StartedAt returns when the process was started.
func (p *Process) StartedAt() time.Time { return p.startedAt }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports the exit status (128+signal when killed) and time, once Done is closed.
func (p *Process) Exited() (status uint32, at time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitStatus, p.exitedAt, !p.exitedAt.IsZero()
}

// Label is the process's SELinux label now ("" without SELinux): the pod's when it
// took the Config's SELinuxLabel, the shim's when the policy refused it.
func (p *Process) Label() string {
	if !selinux.GetEnabled() {
		return ""
	}
	l, err := selinux.PidLabel(p.pid)
	if err != nil {
		return ""
	}
	return l
}

// Signal sends sig; it is a no-op once the process has exited.
func (p *Process) Signal(sig os.Signal) error {
	// os.Process signals through a pidfd, so a recycled pid is never hit.
	err := p.proc.Signal(sig)
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal pause process %d: %w", p.pid, err)
	}
	return nil
}

// Stop sends SIGTERM, then SIGKILL after grace (at once when grace is 0), and waits for
// the process to exit or ctx to end.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	if grace > 0 {
		if err := p.Signal(unix.SIGTERM); err != nil {
			return err
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return nil
		case <-t.C:
		case <-ctx.Done():
		}
	}
	if err := p.Signal(unix.SIGKILL); err != nil {
		return err
	}
	// Not bounded by ctx: once SIGKILL is sent, returning before the exit would only
	// make the caller's cleanup (cgroup removal) fail.
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("pause process %d did not exit %s after SIGKILL", p.pid, killWait)
	}
}

// killWait bounds the wait for a SIGKILLed process (one stuck in D state never exits).
const killWait = 10 * time.Second
