// Package run runs one container of a wasm pod: the WASI preview 1 module an OCI
// bundle's process.args[0] names, with wazero, its rootfs and bind mounts preopened,
// its memory limit enforced and its exit mapped to a process exit code.
package run

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// wasmPageSize is the size of one page of WebAssembly linear memory.
const wasmPageSize = 65536

// maxPages is the most pages a 32-bit linear memory can have (4 GiB).
const maxPages = 65536

// maxConfigSize bounds the config.json read into memory; real ones are a few KiB.
const maxConfigSize = 4 << 20

// wasmMagic starts every WebAssembly binary; coreVersion follows it in a core module
// (a component has another version and layer, which WASI preview 1 cannot run).
var (
	wasmMagic   = []byte{0x00, 'a', 's', 'm'}
	coreVersion = []byte{0x01, 0x00, 0x00, 0x00}
)

// Mount is a host directory the module sees at Destination.
type Mount struct {
	// Source is the host directory; empty for a tmpfs, which Run backs with a fresh
	// temporary directory removed when the run ends.
	Source      string
	Destination string
	ReadOnly    bool
}

// Plan is what Load read from a bundle: everything Run needs, checked.
type Plan struct {
	// Rootfs is the host directory preopened as "/" (symlinks resolved).
	Rootfs string
	// ReadOnlyRootfs is spec.root.readonly.
	ReadOnlyRootfs bool
	// Module is the host path of the .wasm file, resolved inside Rootfs.
	Module string
	// Args are process.args, args[0] (the module's path as given) the program name.
	Args []string
	// Env is process.env with PWD set to Cwd (WASI has no working directory; Go's and
	// wasi-libc's runtimes take it from PWD, as wasmtime passes it).
	Env []string
	// Cwd is process.cwd, the guest's working directory.
	Cwd string
	// Mounts are the spec's bind and tmpfs mounts, in spec order.
	Mounts []Mount
	// Skipped names the spec's mounts a WASI module cannot use (proc, sysfs, devpts,
	// mqueue, cgroup, /dev, binds of a file), with the reason, for the caller to log.
	Skipped []string
	// MemoryLimitPages is linux.resources.memory.limit in 64 KiB pages (at least 1,
	// at most 65536); 0 when the spec sets no limit.
	MemoryLimitPages uint32
	// CacheDir, when set, holds wazero's compiled modules, so that containers of the
	// same module (even in other processes) skip the compilation. Load leaves it
	// empty; the caller sets it.
	CacheDir string
}

// Load reads and checks the OCI bundle at bundle: config.json, the rootfs (already
// mounted by the caller) and the module process.args[0] names. Every fault of the spec
// is an error naming the field.
func Load(bundle string) (*Plan, error) {
	spec, err := readSpec(bundle)
	if err != nil {
		return nil, err
	}
	return planOf(bundle, spec)
}

func readSpec(bundle string) (*specs.Spec, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("read bundle %s: %w", bundle, err)
	}
	if len(b) > maxConfigSize {
		return nil, fmt.Errorf("bundle %s: config.json is larger than %d bytes", bundle, maxConfigSize)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("bundle %s: config.json: %w", bundle, err)
	}
	return &spec, nil
}

func planOf(bundle string, spec *specs.Spec) (*Plan, error) {
	if spec.Process == nil {
		return nil, errors.New("spec: process is missing")
	}
	p := &Plan{Args: slices.Clone(spec.Process.Args)}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, errors.New("spec: process.args is empty: args[0] must name the .wasm module")
	}
	p.Cwd = spec.Process.Cwd
	if p.Cwd == "" {
		p.Cwd = "/"
	}
	if !path.IsAbs(p.Cwd) {
		return nil, fmt.Errorf("spec: process.cwd %q is not absolute", spec.Process.Cwd)
	}
	p.Cwd = path.Clean(p.Cwd)
	env, err := envOf(spec.Process.Env, p.Cwd)
	if err != nil {
		return nil, err
	}
	p.Env = env

	rootPath := "rootfs"
	if spec.Root != nil {
		if spec.Root.Path != "" {
			rootPath = spec.Root.Path
		}
		p.ReadOnlyRootfs = spec.Root.Readonly
	}
	if !filepath.IsAbs(rootPath) {
		rootPath = filepath.Join(bundle, rootPath)
	}
	// The rootfs path is the caller's (trusted); its own symlinks are resolved once so
	// that the confinement below compares real paths.
	root, err := filepath.EvalSymlinks(rootPath)
	if err != nil {
		return nil, fmt.Errorf("spec: root.path: %w", err)
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("spec: root.path: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("spec: root.path %s is not a directory", root)
	}
	p.Rootfs = root

	if p.Module, err = findModule(root, p.Cwd, p.Args[0]); err != nil {
		return nil, err
	}
	if err := p.addMounts(bundle, spec.Mounts); err != nil {
		return nil, err
	}
	if spec.Linux != nil && spec.Linux.Resources != nil && spec.Linux.Resources.Memory != nil {
		p.MemoryLimitPages = limitPages(spec.Linux.Resources.Memory.Limit)
	}
	return p, nil
}

// envOf checks process.env and sets PWD to cwd unless the spec sets it.
func envOf(env []string, cwd string) ([]string, error) {
	out := make([]string, 0, len(env)+1)
	hasPWD := false
	for i, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("spec: process.env[%d] %q is not KEY=VALUE", i, kv)
		}
		if strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("spec: process.env[%d] %q contains a NUL byte", i, k)
		}
		hasPWD = hasPWD || k == "PWD"
		out = append(out, kv)
	}
	if !hasPWD {
		out = append(out, "PWD="+cwd)
	}
	return out, nil
}

// limitPages turns a memory limit in bytes into whole pages: at least one, at most
// the 4 GiB a 32-bit memory can address; 0 (no limit) for none or a negative one.
func limitPages(limit *int64) uint32 {
	if limit == nil || *limit <= 0 {
		return 0
	}
	pages := *limit / wasmPageSize
	return uint32(min(max(pages, 1), maxPages))
}

// findModule resolves the module arg0 names (absolute, or relative to cwd) inside
// root, symlinks included, and checks that it is a WebAssembly core module.
func findModule(root, cwd, arg0 string) (string, error) {
	guest := arg0
	if !path.IsAbs(guest) {
		guest = path.Join(cwd, guest)
	}
	guest = path.Clean(guest)
	// A ".." that climbs above "/" is clamped there by SecureJoin, as the kernel does
	// in a chroot; refuse it instead, as it can only be a mistake or an attempt.
	if climbs(cwd, arg0) {
		return "", fmt.Errorf("spec: process.args[0] %q escapes the rootfs", arg0)
	}
	host, err := securejoin.SecureJoin(root, guest)
	if err != nil {
		return "", fmt.Errorf("spec: process.args[0] %q: %w", arg0, err)
	}
	// SecureJoin resolves symlinks as if root were "/", so an absolute symlink or one
	// with too many ".." stays inside: report the module it reached, not the host's.
	if !within(root, host) {
		return "", fmt.Errorf("spec: process.args[0] %q escapes the rootfs", arg0)
	}
	f, err := os.Open(host)
	if err != nil {
		return "", fmt.Errorf("spec: process.args[0] %q: module not found in the rootfs: %w", arg0, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("spec: process.args[0] %q: %w", arg0, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("spec: process.args[0] %q is not a regular file", arg0)
	}
	head := make([]byte, 8)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("spec: process.args[0] %q: %w", arg0, err)
	}
	head = head[:n]
	if !bytes.HasPrefix(head, wasmMagic) {
		return "", fmt.Errorf("spec: process.args[0] %q is not a WebAssembly module (it does not start with \\0asm)", arg0)
	}
	if len(head) < 8 || !bytes.Equal(head[4:8], coreVersion) {
		return "", fmt.Errorf("spec: process.args[0] %q is not a WebAssembly core module (version % x; a component cannot run as WASI preview 1)", arg0, head[4:])
	}
	return host, nil
}

// climbs reports whether the guest path p (relative to cwd when not absolute) uses
// ".." to climb above "/".
func climbs(cwd, p string) bool {
	if !path.IsAbs(p) {
		p = strings.TrimSuffix(cwd, "/") + "/" + p
	}
	depth := 0
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if depth == 0 {
				return true
			}
			depth--
		default:
			depth++
		}
	}
	return false
}

// within reports whether host path p is root or beneath it.
func within(root, p string) bool {
	return p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}

// addMounts keeps the spec's mounts a WASI module can use: binds of directories and
// tmpfs (a fresh directory at run time); the others are listed in Skipped.
func (p *Plan) addMounts(bundle string, mounts []specs.Mount) error {
	for i, m := range mounts {
		field := fmt.Sprintf("spec: mounts[%d] (%s)", i, m.Destination)
		if m.Destination == "" || !path.IsAbs(m.Destination) {
			return fmt.Errorf("%s: destination %q is not absolute", field, m.Destination)
		}
		dest := path.Clean(m.Destination)
		if dest == "/" {
			return fmt.Errorf("%s: a mount over the rootfs itself cannot be preopened", field)
		}
		ro := slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rro")
		isBind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		switch {
		case isBind:
			src := m.Source
			if src == "" {
				return fmt.Errorf("%s: bind mount without a source", field)
			}
			if !filepath.IsAbs(src) {
				src = filepath.Join(bundle, src)
			}
			fi, err := os.Stat(src)
			if err != nil {
				return fmt.Errorf("%s: source: %w", field, err)
			}
			if !fi.IsDir() {
				// A WASI preopen is a directory: /etc/hosts, /etc/resolv.conf and
				// the termination log cannot be given to a module this way.
				p.Skipped = append(p.Skipped, dest+": bind of a file (WASI preopens only directories)")
				continue
			}
			src, err = filepath.EvalSymlinks(src)
			if err != nil {
				return fmt.Errorf("%s: source: %w", field, err)
			}
			p.setMount(Mount{Source: src, Destination: dest, ReadOnly: ro})
		case m.Type == "tmpfs" && dest != "/dev" && !strings.HasPrefix(dest, "/dev/"):
			p.setMount(Mount{Destination: dest, ReadOnly: ro})
		default:
			p.Skipped = append(p.Skipped, fmt.Sprintf("%s: type %q (a WASI module cannot use it)", dest, m.Type))
		}
	}
	return nil
}

// setMount adds m, replacing an earlier mount at the same destination as a later
// mount hides an earlier one.
func (p *Plan) setMount(m Mount) {
	p.Mounts = slices.DeleteFunc(p.Mounts, func(o Mount) bool { return o.Destination == m.Destination })
	p.Mounts = append(p.Mounts, m)
}
