package run

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// mainEnv makes the test binary run Main with its arguments instead of the tests, so
// that a test can signal a real _run process.
const mainEnv = "CRISP_WASM_RUN_MAIN"

// testDir holds what the tests of this binary share: the probe module built once,
// and the compilation cache most runs use so that they skip the compilation.
var testDir string

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	d, err := os.MkdirTemp("", "crisp-wasm-run-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = d
	code := m.Run()
	_ = os.RemoveAll(d)
	os.Exit(code)
}

var probeBuild struct {
	once sync.Once
	path string
	err  error
}

// probe returns testdata/probe built for wasip1 (once per test binary run).
func probe(t testing.TB) string {
	t.Helper()
	probeBuild.once.Do(func() {
		// go test puts the go command that runs it first in PATH.
		goBin, err := exec.LookPath("go")
		if err != nil {
			probeBuild.err = fmt.Errorf("find the go command: %w", err)
			return
		}
		out := filepath.Join(testDir, "probe.wasm")
		cmd := exec.Command(goBin, "build", "-o", out, "./testdata/probe")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			probeBuild.err = fmt.Errorf("build probe for wasip1: %v\n%s", err, b)
			return
		}
		probeBuild.path = out
	})
	if probeBuild.err != nil {
		t.Fatal(probeBuild.err)
	}
	return probeBuild.path
}

// bundle writes an OCI bundle whose rootfs holds the probe at /bin/probe.wasm and
// /etc/motd, with process.args "probe.wasm"-relative to cwd /bin and args appended,
// and returns its directory. edit changes the spec before it is written.
func bundle(t *testing.T, edit func(*specs.Spec), args ...string) string {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "data"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin, err := os.ReadFile(probe(t))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(rootfs, "bin", "probe.wasm"), bin)
	writeFile(t, filepath.Join(rootfs, "etc", "motd"), []byte("message of the day\n"))
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args: append([]string{"/bin/probe.wasm"}, args...),
			Env:  []string{"PATH=/bin", "GREETING=hi there"},
			Cwd:  "/",
		},
	}
	if edit != nil {
		edit(spec)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.json"), b)
	return dir
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// result is what one run did.
type result struct {
	code           int
	err            error
	stdout, stderr string
	took           time.Duration
}

// run loads bundle and runs it with the shared compilation cache.
func run(t *testing.T, ctx context.Context, bundle string) result {
	t.Helper()
	p, err := Load(bundle)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	p.CacheDir = filepath.Join(testDir, "cache")
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code, err := p.Run(ctx, strings.NewReader(""), &stdout, &stderr)
	return result{code: code, err: err, stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
}

func TestRun(t *testing.T) {
	hostDir := t.TempDir()
	writeFile(t, filepath.Join(hostDir, "in.txt"), []byte("from the host\n"))
	roDir := t.TempDir()
	writeFile(t, filepath.Join(roDir, "in.txt"), []byte("read-only host file\n"))
	withMounts := func(s *specs.Spec) {
		s.Mounts = []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/work", Type: "bind", Source: hostDir, Options: []string{"rbind", "rw"}},
			{Destination: "/config", Source: roDir, Options: []string{"rbind", "ro"}},
			{Destination: "/scratch", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid"}},
		}
	}
	readOnly := func(s *specs.Spec) { withMounts(s); s.Root.Readonly = true }
	tests := []struct {
		name       string
		edit       func(*specs.Spec)
		args       []string
		wantCode   int
		wantStdout string // exact
		wantStderr string // substring
	}{
		{name: "hello", args: []string{"hello"}, wantStdout: "hello from stdout\n", wantStderr: "hello from stderr"},
		{name: "args", args: []string{"args", "a b", "-x"}, wantStdout: "/bin/probe.wasm\nargs\na b\n-x\n"},
		{name: "env", args: []string{"getenv", "GREETING", "PWD", "PATH"}, wantStdout: "GREETING=hi there\nPWD=/\nPATH=/bin\n"},
		{name: "exit code", args: []string{"exit", "3"}, wantCode: 3},
		{name: "exit code above 255", args: []string{"exit", "300"}, wantCode: 255},
		{name: "rootfs file", args: []string{"cat", "/etc/motd"}, wantStdout: "message of the day\n"},
		{
			name: "cwd relative", args: []string{"cat", "../etc/motd"},
			edit: func(s *specs.Spec) {
				s.Process.Cwd = "/bin"
				s.Process.Args[0] = "probe.wasm" // relative to cwd too
			},
			wantStdout: "message of the day\n",
		},
		{name: "cwd", args: []string{"cwd"}, edit: func(s *specs.Spec) { s.Process.Cwd = "/etc" }, wantStdout: "/etc\n"},
		{name: "write rw rootfs", args: []string{"write", "/data/out", "x"}, wantStdout: "wrote /data/out\n"},
		{name: "write ro rootfs", args: []string{"write", "/data/out", "x"}, edit: readOnly, wantCode: 1, wantStderr: "Read-only file system"},
		{name: "write rw bind of ro rootfs", args: []string{"write", "/work/out.txt", "written by wasm"}, edit: readOnly, wantStdout: "wrote /work/out.txt\n"},
		{name: "read rw bind", args: []string{"cat", "/work/in.txt"}, edit: withMounts, wantStdout: "from the host\n"},
		{name: "read ro bind", args: []string{"cat", "/config/in.txt"}, edit: withMounts, wantStdout: "read-only host file\n"},
		{name: "write ro bind", args: []string{"write", "/config/new", "x"}, edit: withMounts, wantCode: 1, wantStderr: "Read-only file system"},
		{name: "write tmpfs", args: []string{"write", "/scratch/f", "x"}, edit: readOnly, wantStdout: "wrote /scratch/f\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, t.Context(), bundle(t, tc.edit, tc.args...))
			if res.err != nil || res.code != tc.wantCode {
				t.Fatalf("Run = %d, %v; want %d, nil\nstdout: %s\nstderr: %s", res.code, res.err, tc.wantCode, res.stdout, res.stderr)
			}
			if res.stdout != tc.wantStdout {
				t.Errorf("stdout = %q, want %q", res.stdout, tc.wantStdout)
			}
			if !strings.Contains(res.stderr, tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", res.stderr, tc.wantStderr)
			}
		})
	}
	b, err := os.ReadFile(filepath.Join(hostDir, "out.txt"))
	if err != nil || string(b) != "written by wasm" {
		t.Errorf("the rw bind mount's host file: %q, %v; want the module's write", b, err)
	}
	if _, err := os.Stat(filepath.Join(roDir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ro bind mount was written: %v", err)
	}
}

// TestSymlinksConfined checks that symlinks of the rootfs (and those the module
// follows) resolve inside it, never on the host.
func TestSymlinksConfined(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret"), []byte("host secret\n"))
	dir := bundle(t, nil)
	rootfs := filepath.Join(dir, "rootfs")
	for name, target := range map[string]string{
		"abs":      outside,                   // absolute, to a host directory
		"climb":    "../../../../../../../..", // climbs past the rootfs
		"etc-link": "/etc",                    // absolute, meant for the rootfs
	} {
		if err := os.Symlink(target, filepath.Join(rootfs, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		path, want string
	}{
		{path: "/abs/secret"},
		{path: "/climb" + outside + "/secret"},
		{path: "/etc-link/motd", want: "message of the day\n"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res := run(t, t.Context(), bundle(t, func(s *specs.Spec) {
				s.Root.Path = rootfs
				s.Process.Args = []string{"/bin/probe.wasm", "cat", tc.path}
			}))
			if tc.want != "" {
				if res.code != 0 || res.stdout != tc.want {
					t.Fatalf("cat %s = %d %q (%s), want %q", tc.path, res.code, res.stdout, res.stderr, tc.want)
				}
				return
			}
			if res.code != 1 || strings.Contains(res.stdout, "secret") || !strings.Contains(strings.ToLower(res.stderr), "no such file") {
				t.Fatalf("cat %s = %d, stdout %q, stderr %q; want the file not found inside the rootfs", tc.path, res.code, res.stdout, res.stderr)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	limit := int64(32 << 20)
	withLimit := func(s *specs.Spec) {
		s.Linux = &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}
	}
	t.Run("within", func(t *testing.T) {
		res := run(t, t.Context(), bundle(t, withLimit, "hog", "8"))
		if res.code != 0 || res.err != nil || res.stdout != "allocated 8 MiB\n" {
			t.Fatalf("hog 8 MiB under a 32 MiB limit = %d, %v, %q, %s", res.code, res.err, res.stdout, res.stderr)
		}
	})
	t.Run("beyond", func(t *testing.T) {
		res := run(t, t.Context(), bundle(t, withLimit, "hog", "64"))
		if res.code != ExitMemoryLimit || !errors.Is(res.err, ErrMemoryLimit) {
			t.Fatalf("hog 64 MiB under a 32 MiB limit = %d, %v; want %d, ErrMemoryLimit\nstdout: %s\nstderr: %s",
				res.code, res.err, ExitMemoryLimit, res.stdout, res.stderr)
		}
		if !strings.Contains(res.err.Error(), "33554432 bytes (32 MiB)") {
			t.Errorf("error %q does not name the limit", res.err)
		}
		t.Logf("error: %v; the module's stderr starts %q", res.err, firstLine(res.stderr))
	})
	t.Run("no limit", func(t *testing.T) {
		res := run(t, t.Context(), bundle(t, nil, "hog", "64"))
		if res.code != 0 || res.err != nil {
			t.Fatalf("hog 64 MiB without a limit = %d, %v, %s", res.code, res.err, res.stderr)
		}
	})
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// startRun runs bundle in the background and returns once the module printed its
// first line (so that it is past its start), with the channel of its result.
func startRun(t *testing.T, ctx context.Context, bundle string) <-chan result {
	t.Helper()
	p, err := Load(bundle)
	if err != nil {
		t.Fatal(err)
	}
	p.CacheDir = filepath.Join(testDir, "cache")
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan result, 1)
	go func() {
		code, err := p.Run(ctx, strings.NewReader(""), pw, &stderr)
		pw.Close()
		done <- result{code: code, err: err, stderr: stderr.String()}
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("module printed nothing: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	t.Logf("module says %q", strings.TrimSpace(line))
	return done
}

func TestCancel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		cause    error
		wantCode int
	}{
		{name: "sleeping", args: []string{"sleep", "1h"}, cause: context.Canceled, wantCode: ExitTerminated},
		{name: "spinning", args: []string{"spin"}, cause: context.Canceled, wantCode: ExitTerminated},
		{name: "killed", args: []string{"sleep", "1h"}, cause: ErrKilled, wantCode: ExitKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			done := startRun(t, ctx, bundle(t, nil, tc.args...))
			start := time.Now()
			cancel(tc.cause)
			select {
			case res := <-done:
				if res.code != tc.wantCode || !errors.Is(res.err, tc.cause) {
					t.Fatalf("cancelled run = %d, %v; want %d and the cause %v", res.code, res.err, tc.wantCode, tc.cause)
				}
				t.Logf("stopped %v after the cancellation", time.Since(start))
			case <-time.After(time.Second):
				t.Fatal("the module still runs a second after its context was cancelled")
			}
		})
	}
}

// TestMainSIGTERM runs a real _run process (this test binary as Main) and stops it
// with SIGTERM.
func TestMainSIGTERM(t *testing.T) {
	dir := bundle(t, nil, "sleep", "1h")
	cmd := exec.Command(os.Args[0], "--cache-dir", filepath.Join(testDir, "cache"), dir)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "sleeping\n" {
		t.Fatalf("_run printed %q, %v; stderr: %s", line, err, stderr.String())
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != ExitTerminated {
			t.Fatalf("_run after SIGTERM: %v; want exit code %d; stderr: %s", err, ExitTerminated, stderr.String())
		}
		t.Logf("_run exited %d %v after SIGTERM", ee.ExitCode(), time.Since(start))
	case <-time.After(time.Second):
		t.Fatal("_run still runs a second after SIGTERM")
	}
}

// TestMainOOMFile: _run creates its --oom-file when the module exceeds its memory
// limit, and only then (the shim tells an OOM kill from a SIGKILL by it).
func TestMainOOMFile(t *testing.T) {
	limit := int64(32 << 20)
	withLimit := func(s *specs.Spec) {
		s.Linux = &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}
	}
	for _, tc := range []struct {
		name     string
		mib      string
		wantCode int
	}{
		{name: "beyond", mib: "64", wantCode: ExitMemoryLimit},
		{name: "within", mib: "8", wantCode: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oom := filepath.Join(t.TempDir(), "c.oom")
			cmd := exec.Command(os.Args[0], "--cache-dir", filepath.Join(testDir, "cache"), "--oom-file", oom, bundle(t, withLimit, "hog", tc.mib))
			cmd.Env = append(os.Environ(), mainEnv+"=1")
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			_, serr := os.Stat(oom)
			if code != tc.wantCode || (serr == nil) != (tc.wantCode == ExitMemoryLimit) {
				t.Fatalf("_run hog %s MiB exited %d (want %d), oom file: %v; output %s", tc.mib, code, tc.wantCode, serr, out)
			}
		})
	}
}

func TestMainLoadError(t *testing.T) {
	dir := bundle(t, func(s *specs.Spec) { s.Process.Args = []string{"/etc/motd"} })
	cmd := exec.Command(os.Args[0], dir)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitCannotRun || !strings.Contains(string(out), "is not a WebAssembly module") {
		t.Fatalf("_run of a text file: %v, %s; want exit code %d and the reason on stderr", err, out, ExitCannotRun)
	}
}

// trapModule is a core module whose _start executes unreachable.
var trapModule = []byte{
	0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00,
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type section: () -> ()
	0x03, 0x02, 0x01, 0x00, // function section: one function of type 0
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, // export _start
	0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b, // code: unreachable, end
}

func TestTrap(t *testing.T) {
	dir := bundle(t, func(s *specs.Spec) { s.Process.Args = []string{"/bin/trap.wasm"} })
	writeFile(t, filepath.Join(dir, "rootfs", "bin", "trap.wasm"), trapModule)
	res := run(t, t.Context(), dir)
	if res.code != ExitTrap || !errors.Is(res.err, ErrTrap) || !strings.Contains(res.err.Error(), "unreachable") {
		t.Fatalf("Run of a trapping module = %d, %v; want %d, ErrTrap naming the trap", res.code, res.err, ExitTrap)
	}
}

func TestLoadErrors(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "outside.wasm"), trapModule)
	component := append([]byte{0x00, 'a', 's', 'm', 0x0d, 0x00, 0x01, 0x00}, make([]byte, 8)...)
	for _, tc := range []struct {
		name  string
		edit  func(s *specs.Spec, rootfs string)
		want  string
		check func(*Plan) error // for loads that must succeed
	}{
		{
			name: "dot-dot escape",
			edit: func(s *specs.Spec, _ string) { s.Process.Args[0] = "../../../../" + outside + "/outside.wasm" },
			want: "escapes the rootfs",
		},
		{
			name: "absolute dot-dot escape",
			edit: func(s *specs.Spec, _ string) { s.Process.Args[0] = "/bin/../.." + outside + "/outside.wasm" },
			want: "escapes the rootfs",
		},
		{
			name: "symlink escape",
			edit: func(s *specs.Spec, rootfs string) {
				mustSymlink(t, filepath.Join(outside, "outside.wasm"), filepath.Join(rootfs, "bin", "link.wasm"))
				s.Process.Args[0] = "/bin/link.wasm"
			},
			want: "module not found in the rootfs",
		},
		{
			name: "symlink inside",
			edit: func(s *specs.Spec, rootfs string) {
				mustSymlink(t, "/bin/probe.wasm", filepath.Join(rootfs, "app.wasm"))
				s.Process.Args[0] = "/app.wasm"
			},
			check: func(p *Plan) error {
				if !strings.HasSuffix(p.Module, "/rootfs/bin/probe.wasm") {
					return fmt.Errorf("module %s, want the rootfs's /bin/probe.wasm", p.Module)
				}
				return nil
			},
		},
		{name: "not wasm", edit: func(s *specs.Spec, _ string) { s.Process.Args[0] = "/etc/motd" }, want: `"/etc/motd" is not a WebAssembly module`},
		{
			name: "component",
			edit: func(s *specs.Spec, rootfs string) {
				writeFile(t, filepath.Join(rootfs, "c.wasm"), component)
				s.Process.Args[0] = "/c.wasm"
			},
			want: "not a WebAssembly core module",
		},
		{name: "directory", edit: func(s *specs.Spec, _ string) { s.Process.Args[0] = "/bin" }, want: "not a regular file"},
		{name: "missing module", edit: func(s *specs.Spec, _ string) { s.Process.Args[0] = "/nope.wasm" }, want: "module not found"},
		{name: "no args", edit: func(s *specs.Spec, _ string) { s.Process.Args = nil }, want: "process.args is empty"},
		{name: "no process", edit: func(s *specs.Spec, _ string) { s.Process = nil }, want: "process is missing"},
		{name: "relative cwd", edit: func(s *specs.Spec, _ string) { s.Process.Cwd = "bin" }, want: "process.cwd"},
		{name: "bad env", edit: func(s *specs.Spec, _ string) { s.Process.Env = []string{"A=1", "JUSTAKEY"} }, want: "process.env[1]"},
		{name: "missing rootfs", edit: func(s *specs.Spec, _ string) { s.Root.Path = "nope" }, want: "root.path"},
		{
			name: "bind without source",
			edit: func(s *specs.Spec, _ string) {
				s.Mounts = []specs.Mount{{Destination: "/x", Type: "bind", Source: "/does/not/exist"}}
			},
			want: "mounts[0] (/x): source",
		},
		{
			name: "relative destination",
			edit: func(s *specs.Spec, _ string) { s.Mounts = []specs.Mount{{Destination: "x", Type: "tmpfs"}} },
			want: "mounts[0] (x): destination",
		},
		{
			name: "skipped mounts and memory",
			edit: func(s *specs.Spec, _ string) {
				limit := int64(100<<20 + 1)
				s.Linux = &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}
				s.Mounts = []specs.Mount{
					{Destination: "/proc", Type: "proc"},
					{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(outside, "outside.wasm")},
				}
			},
			check: func(p *Plan) error {
				if len(p.Mounts) != 0 || len(p.Skipped) != 2 {
					return fmt.Errorf("mounts %v, skipped %q; want none and two", p.Mounts, p.Skipped)
				}
				if p.MemoryLimitPages != 1600 {
					return fmt.Errorf("MemoryLimitPages = %d, want 1600", p.MemoryLimitPages)
				}
				return nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bundle(t, nil)
			rootfs := filepath.Join(dir, "rootfs")
			spec, err := readSpec(dir)
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(spec, rootfs)
			p, err := planOf(dir, spec)
			if tc.check != nil {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if err := tc.check(p); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error containing %q", err, tc.want)
			}
			t.Logf("%v", err)
		})
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestCompilationCache measures a module's start (Run of a module that exits at
// once) without a cache, with an empty one and with one that holds the module.
func TestCompilationCache(t *testing.T) {
	dir := bundle(t, nil, "true")
	p, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	measure := func(cacheDir string) time.Duration {
		p.CacheDir = cacheDir
		start := time.Now()
		code, err := p.Run(t.Context(), strings.NewReader(""), io.Discard, io.Discard)
		if code != 0 || err != nil {
			t.Fatalf("Run = %d, %v", code, err)
		}
		return time.Since(start)
	}
	noCache := measure("")
	cacheDir := filepath.Join(t.TempDir(), "cache")
	cold := measure(cacheDir)
	entries, err := os.ReadDir(cacheDir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("the compilation cache %s holds nothing after a run: %v", cacheDir, err)
	}
	warm := measure(cacheDir)
	t.Logf("start of a %d KiB Go module (%s): without a cache %v, empty cache %v, cached %v",
		fileSize(t, p.Module)>>10, runtime.GOARCH, noCache.Round(time.Millisecond), cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	if warm >= noCache {
		t.Errorf("a cached start (%v) is not faster than one without a cache (%v)", warm, noCache)
	}
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
