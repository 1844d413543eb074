// Package runscpf opens port-forward connections into gVisor sandboxes. gVisor's
// netstack, inside the sandbox, holds a pod's sockets, so dialing a port in the pod's
// network namespace reaches nothing; `runsc port-forward --stream` instead hands the
// sandbox one end of a unix socket, and the Sentry connects it to the port on its own
// loopback.
package runscpf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/crisp-runtime/crisp/internal/spawn"
)

// Defaults of gVisor's shim (pkg/shim/v1/runsccmd.DefaultCommand and
// pkg/shim/v1/proc.RunscRoot) for a config that leaves them out.
const (
	DefaultBinary = "runsc"
	DefaultRoot   = "/run/containerd/runsc"
)

// connectTimeout bounds one connection's set-up: runsc starting, loading the
// sandbox's state and the Sentry connecting to the port.
const connectTimeout = 10 * time.Second

// stderrLimit caps how much of runsc's stderr is kept for an error message.
const stderrLimit = 4096

// Config is how gVisor's shim runs runsc for a runtime handler: the part of the
// handler's ConfigPath TOML (io.containerd.runsc.v1.options) that runsc port-forward
// must agree on to find the shim's sandboxes.
type Config struct {
	// Binary is binary_name: a path, or a name looked up on PATH.
	Binary string `toml:"binary_name"`
	// Root is root: runsc's state root, below which the shim keeps one directory per
	// containerd namespace.
	Root string `toml:"root"`
	// Flags is runsc_config: global runsc flags, which the shim passes to every runsc
	// command.
	Flags map[string]string `toml:"runsc_config"`
}

// Load reads the runsc options file at path as gVisor's shim does (unknown keys are
// the shim's own and ignored); an empty path gives the shim's defaults.
func Load(path string) (Config, error) {
	var c Config
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("read runsc options: %w", err)
		}
		if err := toml.Unmarshal(b, &c); err != nil {
			return Config{}, fmt.Errorf("parse runsc options %s: %w", path, err)
		}
	}
	if c.Binary == "" {
		c.Binary = DefaultBinary
	}
	if c.Root == "" {
		c.Root = DefaultRoot
	}
	return c, nil
}

// Args is the runsc command line that forwards the connection on the unix socket at
// sock to port in the sandbox of containerID: the global flags as the shim gives them
// (pkg/shim/v1/runsccmd.Runsc.args; sorted, so that the line is stable), with the
// root of the shim's containerd namespace.
func (c Config) Args(namespace, sock, containerID string, port int32) []string {
	args := []string{"--root=" + filepath.Join(c.Root, namespace)}
	keys := make([]string, 0, len(c.Flags))
	for k := range c.Flags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, fmt.Sprintf("--%s=%s", k, c.Flags[k]))
	}
	return append(args, "port-forward", "--stream", sock, containerID, strconv.Itoa(int(port)))
}

// Dial connects to 127.0.0.1:port in the gVisor sandbox whose root container is
// containerID (the pod's sandbox container), in the shim's containerd namespace.
// The unix socket that runsc connects to lives in a directory of its own (mode 0700)
// below dir and is gone when Dial returns; runsc has exited by then.
//
// Closing the write side of the returned connection half-closes the TCP connection
// in the pod with the proxy patch of hack/gvisor.sh (unpatched, the Sentry closes it
// whole); the pod's half-close still ends both directions.
func (c Config) Dial(ctx context.Context, dir, namespace, containerID string, port int32) (*net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("port-forward socket directory: %w", err)
	}
	sockDir, err := os.MkdirTemp(dir, "pf-")
	if err != nil {
		return nil, fmt.Errorf("port-forward socket directory: %w", err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("port-forward socket: %w", err)
	}
	defer l.Close()

	var stderr limitedBuffer
	cmd := exec.Command(c.Binary, c.Args(namespace, sock, containerID, port)...)
	cmd.Stderr = &stderr
	// runsc must not outlive criserver should it hang talking to the sandbox; started
	// from the spawn thread, it gets that signal only when criserver dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("start runsc port-forward: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		conn, err := l.AcceptUnix()
		if err != nil {
			conn = nil
		}
		accepted <- conn
	}()
	// abandon ends the accept and closes what it may have accepted; the listener
	// must stay open until then, since closing it drops a connection not yet
	// accepted.
	abandon := func() {
		_ = l.Close()
		if conn := <-accepted; conn != nil {
			_ = conn.Close()
		}
	}
	// failure says why the connection failed, with what runsc wrote.
	failure := func(why error) error {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("runsc port-forward: %w: %s", why, msg)
		}
		return fmt.Errorf("runsc port-forward: %w", why)
	}

	// runsc connects, hands its end to the Sentry and exits: 0 once the Sentry
	// connected to the port, otherwise the Sentry's error on stderr.
	var werr error
	select {
	case werr = <-exited:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		abandon()
		return nil, failure(ctx.Err())
	}
	if werr != nil {
		abandon()
		return nil, failure(werr)
	}
	select {
	case conn := <-accepted:
		if conn == nil {
			return nil, failure(errors.New("accept on the port-forward socket failed"))
		}
		return conn, nil
	case <-ctx.Done():
		abandon()
		return nil, failure(errors.New("runsc exited 0 without connecting to the port-forward socket"))
	}
}

// limitedBuffer keeps the first stderrLimit bytes written to it. Wait's copy
// goroutine writes while an error path may read.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := stderrLimit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
