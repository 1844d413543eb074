package tasksandbox

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/crisp-runtime/crisp/internal/config"
)

// Config is what the task-only sandboxer needs of criserver's setup.
type Config struct {
	// Runtimes are criserver's runtime handlers; those whose sandbox_mode is task are
	// the sandboxer's.
	Runtimes map[string]config.Runtime
	// StateDir is criserver's state directory: a runc shim's Root defaults below it.
	StateDir string
	// SystemdCgroup is criserver's cgroup driver, which runc shims follow.
	SystemdCgroup bool
	// ContainerDir holds the containers' bundles, one directory per container id.
	ContainerDir string
	// Address is criserver's own address and SocketDir the directory it gives shims
	// for their sockets: runtime-v2 shims name their socket after both.
	Address, SocketDir string
	// Log receives the shims' own log lines and what the sandboxer cleans up.
	Log *slog.Logger
}

// Sandboxer is the task-only sandboxer: the runtime options of each task-only handler
// and the output copies of their containers. It is safe for concurrent use.
type Sandboxer struct {
	cfg Config
	log *slog.Logger
	// opts are the runtime options of each task-only handler (see RuntimeOptions).
	opts map[string]*anypb.Any
	// ios copy the output of task-only shims' containers, by container id.
	iosMu sync.Mutex
	ios   map[string]*IO
	// oom are the containers shims reported OOM kills of (events.go).
	oom oomSet
}

// New encodes the runtime options of every task-only handler of cfg.Runtimes.
func New(cfg Config) (*Sandboxer, error) {
	s := &Sandboxer{cfg: cfg, log: cfg.Log, opts: map[string]*anypb.Any{}, ios: map[string]*IO{}}
	for name, rt := range cfg.Runtimes {
		if rt.Mode() != config.SandboxModeTask {
			continue
		}
		a, err := RuntimeOptions(name, rt, cfg.StateDir, cfg.SystemdCgroup)
		if err != nil {
			return nil, err
		}
		s.opts[name] = a
	}
	return s, nil
}

// Handlers counts the task-only handlers.
func (s *Sandboxer) Handlers() int { return len(s.opts) }

// Options are the runtime options of task-only handler name (nil for any other): sent
// at the shim's start and with every task Create, as containerd sends them.
func (s *Sandboxer) Options(name string) *anypb.Any { return s.opts[name] }

// containerBundle is the bundle of container id.
func (s *Sandboxer) containerBundle(id string) string {
	return filepath.Join(s.cfg.ContainerDir, id)
}

// ShimBinary runs the commands of a pod's shim binary that need no running shim.
type ShimBinary interface {
	// Delete runs `shim delete` for task id, whose bundle is bundle: it kills what
	// the task still runs and removes what the shim made for it.
	Delete(ctx context.Context, id, bundle string) error
}

// Pod is a pod of a task-only shim, as the controller recorded it.
type Pod struct {
	ID, Handler, Namespace string
	// Shim is the shim binary's path.
	Shim string
	// Bundle is the pause container's bundle, where the shim runs.
	Bundle string
	// Started: the pause container was created and started.
	Started bool
	// Binary runs the shim binary's delete.
	Binary ShimBinary
}
