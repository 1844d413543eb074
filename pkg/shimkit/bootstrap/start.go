package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"google.golang.org/protobuf/proto"

	"github.com/crisp-runtime/crisp/api/annotations"
	"github.com/crisp-runtime/crisp/internal/atomicfile"
)

// resultVersion 3 tells containerd that this shim serves the sandbox API and task v3 on
// one socket, so it reuses the sandbox's shim for the pod's containers.
const resultVersion = 3

// startParams is what `start` runs with, from either the bootstrap protocol or the
// legacy flags and environment.
type startParams struct {
	id, namespace, address, ttrpcAddress, socketDir, bundle string
	debug                                                   bool
	// bootstrap is true when the caller sent BootstrapParams and so reads a protobuf
	// BootstrapResult back.
	bootstrap bool
}

// parseBootstrapParams follows containerd's pkg/shim/compat.go: the runtime-options Any
// that containerd ≤2.2 writes to stdin has the same field numbers as BootstrapParams and
// often unmarshals as one, so the payload only counts as BootstrapParams when its
// instance id and namespace match the command line. When neither -id nor -namespace is
// given (a caller speaking only the new protocol), a non-empty instance id suffices:
// legacy callers always pass -id.
func parseBootstrapParams(input []byte, cliID, cliNamespace string) (*bootstrap.BootstrapParams, bool) {
	if len(input) == 0 {
		return nil, false
	}
	p := &bootstrap.BootstrapParams{}
	if err := proto.Unmarshal(input, p); err != nil {
		return nil, false
	}
	if cliID == "" && cliNamespace == "" {
		return p, p.GetInstanceID() != ""
	}
	if p.GetInstanceID() != cliID || p.GetNamespace() != cliNamespace {
		return nil, false
	}
	return p, true
}

func resolveStartParams(f Flags, input []byte, bundle string) (startParams, error) {
	sp := startParams{bundle: bundle, debug: f.Debug, socketDir: DefaultSocketDir}
	if p, ok := parseBootstrapParams(input, f.ID, f.Namespace); ok {
		sp.bootstrap = true
		sp.id, sp.namespace = p.GetInstanceID(), p.GetNamespace()
		sp.address = firstNonEmpty(p.GetContainerdGrpcAddress(), f.Address)
		sp.ttrpcAddress = p.GetContainerdTtrpcAddress()
		sp.debug = sp.debug || p.GetLogLevel() <= bootstrap.LogLevel_LOG_LEVEL_DEBUG
		if d := p.GetSocketDir(); d != "" {
			sp.socketDir = d
		}
	} else {
		// Legacy (containerd ≤2.2, 1.x, CRI-O): flags plus environment; stdin, if any,
		// holds runtime options this shim does not use.
		sp.id = f.ID
		sp.namespace = firstNonEmpty(f.Namespace, os.Getenv("NAMESPACE"), "default")
		sp.address = firstNonEmpty(f.Address, os.Getenv("GRPC_ADDRESS"))
		sp.ttrpcAddress = os.Getenv("TTRPC_ADDRESS")
	}
	if sp.namespace == "" {
		sp.namespace = "default"
	}
	if !ValidID(sp.id) {
		return sp, fmt.Errorf("invalid or missing id %q: want 1-128 characters of [A-Za-z0-9_.-]", sp.id)
	}
	if strings.ContainsAny(sp.namespace, "/\x00") {
		return sp, fmt.Errorf("invalid namespace %q", sp.namespace)
	}
	if !filepath.IsAbs(sp.socketDir) {
		return sp, fmt.Errorf("socket_dir %q must be absolute", sp.socketDir)
	}
	return sp, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// result is what `start` prints. A bootstrap caller gets a protobuf BootstrapResult.
// Legacy callers get the bare address: containerd 1.6 and CRI-O's VM runtime accept
// nothing else but a bare address or (CRI-O) JSON with version ≤2, and containerd 1.7
// rejects JSON with version 3 while sending exactly the environment containerd 2.0-2.2
// sends (MAX_SHIM_VERSION=2, GRPC_ADDRESS, NAMESPACE), so nothing tells the JSON-v3
// callers apart. containerd 2.0-2.2 reads a bare address as version 2.
func (sp startParams) result(socketPath string) ([]byte, error) {
	addr := "unix://" + socketPath
	if !sp.bootstrap {
		return []byte(addr), nil
	}
	data, err := proto.Marshal(&bootstrap.BootstrapResult{Version: resultVersion, Address: addr, Protocol: "ttrpc"})
	if err != nil {
		return nil, fmt.Errorf("encode bootstrap result: %w", err)
	}
	return data, nil
}

// StartOptions are what a shim adds to the kit's `start`.
type StartOptions struct {
	// Environ, when set, edits the serving shim's environment (the caller's, which it
	// gets as environ) before the kit sets where task events go (NAMESPACE,
	// TTRPC_ADDRESS, GRPC_ADDRESS on the bootstrap path).
	Environ func(environ []string) []string
}

// Start implements a shim's `start`: make sure one shim serves the id, print how to
// reach it. On failure nothing is left behind.
func Start(ctx context.Context, f Flags, stdin io.Reader, stdout io.Writer, opts StartOptions) error {
	bundle, err := BundleDir(f.Bundle)
	if err != nil {
		return err
	}
	// Held until this process exits (the fd is close-on-exec, the serving child does
	// not inherit it): a criserver that restarts after being killed mid-start waits on
	// it, so it never tears a pod down while its shim is still coming up.
	lock, err := os.Open(bundle)
	if err != nil {
		return fmt.Errorf("open bundle: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock bundle: %w", err)
	}
	var input []byte
	// A person running start by hand has a terminal on stdin, not parameters.
	if f, ok := stdin.(*os.File); !ok || !isTerminal(f) {
		input, err = io.ReadAll(io.LimitReader(stdin, maxStdin+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(input) > maxStdin {
			return fmt.Errorf("stdin is larger than %d bytes", maxStdin)
		}
	}
	sp, err := resolveStartParams(f, input, bundle)
	if err != nil {
		return err
	}
	group := sp.id
	if !sp.bootstrap {
		group = legacyGroup(sp.bundle, sp.id)
	}
	path := SocketPath(sp.socketDir, sp.address, sp.namespace, group)
	if len(path) > maxSocketPath {
		return fmt.Errorf("socket path %q is longer than %d bytes: use a shorter socket_dir", path, maxSocketPath)
	}
	out, err := sp.result(path)
	if err != nil {
		return err
	}

	l, existing, err := listen(ctx, path)
	if err != nil {
		return err
	}
	if existing {
		_, err := stdout.Write(out)
		return err
	}
	if err := spawn(sp, l, path, opts); err != nil {
		_ = l.Close()
		_ = os.Remove(path)
		return err
	}
	_ = l.Close()
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("write start result: %w", err)
	}
	return nil
}

// legacyGroup is the id whose shim serves the task of a legacy start: the group its
// bundle's spec names, else the id itself. A legacy caller (containerd 1.6-2.2) reads
// the bare address this shim prints as task API version 2 and so runs `start` for
// each of a pod's containers too; as with containerd's runc shim, they then share
// the pod's shim instead of getting one shim each. Bootstrap callers (containerd
// 2.3+, crisp's controller) hand a pod's containers to its shim themselves.
func legacyGroup(bundle, id string) string {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return id
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return id
	}
	// The annotations naming the group, in the order containerd's runc shim reads
	// them (cmd/containerd-shim-runc-v2/manager).
	for _, k := range []string{annotations.RuncGroup, annotations.SandboxID} {
		if g := spec.Annotations[k]; g != "" {
			return g
		}
	}
	return id
}

// listen binds the socket, or reports existing=true when a live shim already listens
// there (one shim per pod). A socket nobody answers on is stale and is replaced.
func listen(ctx context.Context, path string) (_ *net.UnixListener, existing bool, _ error) {
	// Only the socket dir itself is private: its parents (e.g. /run/crisp) are shared
	// with the daemon's own socket.
	dir := filepath.Dir(path)
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, false, fmt.Errorf("create socket dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, false, fmt.Errorf("create socket dir: %w", err)
	}
	for attempt := 0; ; attempt++ {
		if answers(ctx, path) {
			return nil, true, nil
		}
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			// The serving child owns the socket from now on: closing the parent's
			// copy must not unlink it.
			l.SetUnlinkOnClose(false)
			if err := os.Chmod(path, 0o600); err != nil {
				_ = l.Close()
				_ = os.Remove(path)
				return nil, false, fmt.Errorf("chmod socket: %w", err)
			}
			return l, false, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt > 0 {
			return nil, false, fmt.Errorf("listen on %s: %w", path, err)
		}
		// In use: either a concurrent start won the race (then it answers now) or
		// the file is left from a dead shim.
		if answers(ctx, path) {
			return nil, true, nil
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, false, fmt.Errorf("remove stale socket: %w", err)
		}
	}
}

func answers(ctx context.Context, path string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// spawn re-executes the binary as the serving shim with the listener as fd 3.
func spawn(sp startParams, l *net.UnixListener, path string, opts StartOptions) (retErr error) {
	lf, err := l.File()
	if err != nil {
		return fmt.Errorf("listener fd: %w", err)
	}
	defer lf.Close()
	logPath := filepath.Join(sp.bundle, LogFile)
	_, statErr := os.Stat(logPath)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open shim log: %w", err)
	}
	defer logf.Close()
	if errors.Is(statErr, os.ErrNotExist) {
		// A failed start leaves nothing behind, but keeps an earlier shim's log.
		defer func() {
			if retErr != nil {
				_ = os.Remove(logPath)
			}
		}()
	}

	args := []string{"-namespace", sp.namespace, "-id", sp.id, "-address", sp.address, "-bundle", sp.bundle}
	if sp.debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Args[0] = os.Args[0]
	cmd.Dir = sp.bundle
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lf}
	environ := os.Environ()
	if opts.Environ != nil {
		environ = opts.Environ(environ)
	}
	cmd.Env = childEnv(environ, sp)
	// Its own session: the shim must outlive the process that ran `start`.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// The address before the shim exists: a start killed right after forking it (the
	// caller's cancel, or its death) leaves a shim that only this file leads a
	// recovering caller, and `delete`, to (its socket may be in any socket_dir).
	addrFile := filepath.Join(sp.bundle, AddressFile)
	if err := atomicfile.Write(addrFile, []byte("unix://"+path), 0o600); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = os.Remove(addrFile)
		return fmt.Errorf("start shim: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			_ = os.Remove(filepath.Join(sp.bundle, PidFile))
			_ = os.Remove(addrFile)
		} else {
			_ = cmd.Process.Release()
		}
	}()
	return atomicfile.Write(filepath.Join(sp.bundle, PidFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
}

// childEnv is the environment of the serving shim: where it publishes task events, as
// the bootstrap caller said it.
func childEnv(environ []string, sp startParams) []string {
	if !sp.bootstrap {
		// The legacy callers say it in the environment they start `start` with.
		return environ
	}
	// A bootstrap caller without a ttrpc address (crisp's controller) gets none,
	// whatever the environment it started the shim with.
	set := map[string]string{"NAMESPACE": sp.namespace, "TTRPC_ADDRESS": sp.ttrpcAddress}
	if sp.address != "" {
		set["GRPC_ADDRESS"] = sp.address
	}
	return SetEnv(environ, set)
}

// SetEnv returns environ with the variables of set replaced, and those set to "" removed.
func SetEnv(environ []string, set map[string]string) []string {
	env := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}
