package run

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
	"golang.org/x/sys/unix"
)

// Exit codes of a run that did not end with the module's own exit code (proc_exit or
// a return from _start, whose code is the module's, 255 when above 255). They follow
// the shell's 128+signal convention, so that kubelet and people read them as they
// read a native container's.
const (
	// ExitCannotRun: the module could not be compiled or instantiated (a bad module,
	// an import WASI preview 1 does not provide); as a shell's 126.
	ExitCannotRun = 126
	// ExitTrap: the module trapped (unreachable, an out-of-bounds access, a stack
	// overflow); as an abort, 128+SIGABRT.
	ExitTrap = 134
	// ExitMemoryLimit: the module ended with a failure after a growth of its memory
	// past the limit was refused (a Go module exits 2 with "out of memory", a Rust
	// one traps); as an OOM kill, 128+SIGKILL. Run's error wraps ErrMemoryLimit.
	ExitMemoryLimit = 137
	// ExitKilled: the run's context was cancelled with ErrKilled as its cause.
	ExitKilled = 137
	// ExitTerminated: the run's context was cancelled (or its deadline passed) for any
	// other cause, as a SIGTERM to _run does; 128+SIGTERM.
	ExitTerminated = 143
)

var (
	// ErrMemoryLimit is wrapped by Run's error when the module failed after its memory
	// hit the limit (ExitMemoryLimit).
	ErrMemoryLimit = errors.New("module exceeded its memory limit")
	// ErrTrap is wrapped by Run's error when the module trapped (ExitTrap).
	ErrTrap = errors.New("module trapped")
	// ErrKilled is the cause to cancel a run's context with for it to end with
	// ExitKilled instead of ExitTerminated.
	ErrKilled = errors.New("module killed")
	// ErrTerminated is the cause Main cancels a run with on SIGTERM or SIGINT.
	ErrTerminated = errors.New("module terminated")
)

// Run compiles and runs the module with stdin, stdout and stderr as its fds 0-2 and
// returns its exit code. The error is nil when the module ended by itself (returned
// from _start or called proc_exit, whatever the code); else it says why the run ended
// otherwise and the code is one of the Exit constants. Cancelling ctx closes the
// module at its next function call or loop iteration (a sleep is cut short too) and
// Run returns ExitTerminated, or ExitKilled when ctx's cause is ErrKilled.
func (p *Plan) Run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	bin, err := os.ReadFile(p.Module)
	if err != nil {
		return ExitCannotRun, fmt.Errorf("read module: %w", err)
	}
	// Closing is not part of the run: it must happen even when ctx is cancelled.
	cleanupCtx := context.WithoutCancel(ctx)

	rc := wazero.NewRuntimeConfig().WithCloseOnContextDone(true)
	// The limit is the allocator's, not wazero's WithMemoryLimitPages: wazero refuses
	// a growth past its own limit before asking the allocator, so the module's
	// failure could not be told to be the limit's. The allocator refuses at the
	// limit and remembers it.
	alloc := &limitAllocator{}
	if p.MemoryLimitPages > 0 && p.MemoryLimitPages < maxPages {
		alloc.limit = uint64(p.MemoryLimitPages) * wasmPageSize
	}
	if p.CacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(p.CacheDir)
		if err != nil {
			return ExitCannotRun, fmt.Errorf("compilation cache %s: %w", p.CacheDir, err)
		}
		defer cache.Close(cleanupCtx)
		rc = rc.WithCompilationCache(cache)
	}
	r := wazero.NewRuntimeWithConfig(ctx, rc)
	defer r.Close(cleanupCtx)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		return ExitCannotRun, fmt.Errorf("instantiate WASI preview 1: %w", err)
	}
	compiled, err := r.CompileModule(ctx, bin)
	if err != nil {
		return ExitCannotRun, fmt.Errorf("compile module %s: %w", p.Args[0], err)
	}
	defer compiled.Close(cleanupCtx)
	// Loading the compiled code (from the cache: the file read whole, then copied to
	// executable memory) left that much garbage on the heap, which the runtime would
	// keep for minutes: returned now, it is 5 MiB less for every running module.
	debug.FreeOSMemory()
	// The allocator cannot refuse a memory's initial size (wazero requires it to
	// succeed): a module whose memory starts above the limit is refused here. Every
	// toolchain exports its memory; one that does not starts unchecked and meets the
	// limit at its first growth.
	for name, m := range compiled.ExportedMemories() {
		if alloc.limit > 0 && uint64(m.Min())*wasmPageSize > alloc.limit {
			return ExitMemoryLimit, fmt.Errorf("module %s: memory %q starts at %d pages, more than the limit of %d: %w",
				p.Args[0], name, m.Min(), p.MemoryLimitPages, ErrMemoryLimit)
		}
	}

	fsc, cleanup, err := p.fsConfig()
	if err != nil {
		return ExitCannotRun, err
	}
	defer cleanup()
	mc := wazero.NewModuleConfig().
		WithArgs(p.Args...).
		WithStdin(stdin).WithStdout(stdout).WithStderr(stderr).
		WithFSConfig(fsc).
		// wazero's defaults are a fake clock and a fixed random source, for
		// reproducible tests; a container wants the real ones.
		WithSysWalltime().WithSysNanotime().
		WithNanosleep(sleeper(ctx)).
		WithRandSource(rand.Reader)
	for _, kv := range p.Env {
		k, v, _ := strings.Cut(kv, "=")
		mc = mc.WithEnv(k, v)
	}
	mod, err := r.InstantiateModule(experimental.WithMemoryAllocator(ctx, alloc), compiled, mc)
	if mod != nil {
		_ = mod.Close(cleanupCtx)
	}
	return p.exitOf(ctx, err, alloc.refused.Load())
}

// exitOf maps how the module's run ended to an exit code and an error.
func (p *Plan) exitOf(ctx context.Context, err error, limitHit bool) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *sys.ExitError
	isExit := errors.As(err, &ee)
	if isExit && (ee.ExitCode() == sys.ExitCodeContextCanceled || ee.ExitCode() == sys.ExitCodeDeadlineExceeded) ||
		!isExit && ctx.Err() != nil {
		cause := context.Cause(ctx)
		if errors.Is(cause, ErrKilled) {
			return ExitKilled, fmt.Errorf("module %s stopped: %w", p.Args[0], cause)
		}
		return ExitTerminated, fmt.Errorf("module %s stopped: %w", p.Args[0], cause)
	}
	if isExit && ee.ExitCode() == 0 {
		return 0, nil
	}
	if limitHit {
		limit := uint64(p.MemoryLimitPages) * wasmPageSize
		return ExitMemoryLimit, fmt.Errorf("module %s failed after its memory reached the limit of %d bytes (%d MiB): %w (%w)",
			p.Args[0], limit, limit>>20, ErrMemoryLimit, err)
	}
	if isExit {
		return int(min(ee.ExitCode(), 255)), nil
	}
	return ExitTrap, fmt.Errorf("%w: %s: %w", ErrTrap, p.Args[0], err)
}

// fsConfig preopens the rootfs at "/" and each mount at its destination, every one
// confined to itself. tmpfs mounts get a fresh directory that cleanup removes.
func (p *Plan) fsConfig() (_ wazero.FSConfig, cleanup func(), err error) {
	var tmps []string
	cleanup = func() {
		for _, d := range tmps {
			_ = os.RemoveAll(d)
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	fsc := wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(newConfinedFS(p.Rootfs, p.ReadOnlyRootfs), "/")
	for _, m := range p.Mounts {
		src := m.Source
		if src == "" {
			d, err := os.MkdirTemp("", "crisp-wasm-tmpfs-")
			if err != nil {
				return nil, nil, fmt.Errorf("tmpfs at %s: %w", m.Destination, err)
			}
			tmps = append(tmps, d)
			src = d
		}
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(newConfinedFS(src, m.ReadOnly), m.Destination)
	}
	return fsc, cleanup, nil
}

// sleeper is the module's nanosleep: a real sleep that ctx cuts short. wazero's own
// (WithSysNanosleep) cannot be interrupted, and a Go module whose goroutines all
// sleep blocks in poll_oneoff for the whole sleep, where WithCloseOnContextDone does
// not reach it.
func sleeper(ctx context.Context) sys.Nanosleep {
	return func(ns int64) {
		t := time.NewTimer(time.Duration(ns))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// limitAllocator backs the module's linear memory and refuses to grow it past limit
// bytes (0: no limit), remembering that it did.
type limitAllocator struct {
	limit   uint64
	refused atomic.Bool
}

// Allocate implements experimental.MemoryAllocator. The memory is an anonymous
// mapping of the most it may grow to, reserved inaccessible (which commits nothing,
// even under strict overcommit) and made writable as it grows: it grows in place,
// with no copy and no old copy left on the Go heap, and only the pages the module
// touches take memory. Go's allocator, copying at each growth, left a Go module's
// process 8 MiB larger.
func (a *limitAllocator) Allocate(capacity, maxBytes uint64) experimental.LinearMemory {
	if a.limit > 0 {
		maxBytes = min(maxBytes, a.limit)
	}
	return &limitedMemory{a: a, max: max(maxBytes, capacity)}
}

// limitedMemory is one linear memory of a limitAllocator.
type limitedMemory struct {
	a       *limitAllocator
	max     uint64 // the most the memory may ever grow to
	mapping []byte // max bytes reserved; nil until the first Reallocate
	rw      uint64 // bytes at its start made writable
	started bool
}

// Reallocate implements experimental.LinearMemory. The first call is the memory's
// initial size, which wazero requires to succeed (Run checks it against the limit).
// A nil return is a refused growth.
func (m *limitedMemory) Reallocate(size uint64) []byte {
	if m.started && m.a.limit > 0 && size > m.a.limit {
		m.a.refused.Store(true)
		return nil
	}
	if m.mapping == nil {
		// At least one page, so that an empty memory maps too.
		b, err := unix.Mmap(-1, 0, int(max(m.max, size, 1)), unix.PROT_NONE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil
		}
		m.mapping = b
	}
	if size > uint64(len(m.mapping)) {
		return nil
	}
	if size > m.rw {
		// Wasm pages are 64 KiB, a multiple of the host's page.
		if err := unix.Mprotect(m.mapping[m.rw:size], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return nil
		}
		m.rw = size
	}
	m.started = true
	return m.mapping[:size:size]
}

// Free implements experimental.LinearMemory.
func (m *limitedMemory) Free() {
	if m.mapping != nil {
		_ = unix.Munmap(m.mapping)
		m.mapping = nil
	}
}
