package runscpf

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// gvisorRunsc is the runsc that hack/gvisor.sh caches (test/e2e/gvisor_test.go).
const gvisorRunsc = "/var/cache/crisp/gvisor-v0.0.0-20260905035102-160fafc42237/bin/runsc"

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, path string
		want       Config
		wantErr    string
	}{
		{name: "no file: the shim's defaults", want: Config{Binary: "runsc", Root: "/run/containerd/runsc"}},
		{
			name: "gVisor's documented options, with the shim's own keys",
			path: write("full.toml", "log_path = \"/var/log/runsc/%ID%/shim.log\"\nlog_level = \"debug\"\nbinary_name = \"/opt/gvisor/runsc\"\nroot = \"/run/gv\"\n"+
				"[runsc_config]\nplatform = \"systrap\"\ndebug = \"true\"\n"),
			want: Config{Binary: "/opt/gvisor/runsc", Root: "/run/gv", Flags: map[string]string{"platform": "systrap", "debug": "true"}},
		},
		{name: "only flags", path: write("flags.toml", "[runsc_config]\nnetwork = \"host\"\n"),
			want: Config{Binary: "runsc", Root: "/run/containerd/runsc", Flags: map[string]string{"network": "host"}}},
		{name: "missing file", path: filepath.Join(dir, "nope.toml"), wantErr: "no such file"},
		{name: "not TOML", path: write("bad.toml", "binary_name = [\n"), wantErr: "parse runsc options"},
		{name: "a flag that is not a string", path: write("int.toml", "[runsc_config]\ndebug = true\n"), wantErr: "parse runsc options"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Load(c.path)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Load: %+v, %v; want an error with %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Binary != c.want.Binary || got.Root != c.want.Root || len(got.Flags) != len(c.want.Flags) {
				t.Fatalf("Load: %+v, want %+v", got, c.want)
			}
			for k, v := range c.want.Flags {
				if got.Flags[k] != v {
					t.Errorf("flag %s = %q, want %q", k, got.Flags[k], v)
				}
			}
		})
	}
}

// The command line is the shim's global flags (root joined with the namespace, as
// proc.NewRunsc does; runsc_config as --key=value) before port-forward.
func TestArgs(t *testing.T) {
	c := Config{Binary: "runsc", Root: "/run/gv", Flags: map[string]string{"platform": "systrap", "debug": "true"}}
	got := c.Args("k8s.io", "/run/crisp/portforward/pf-1/s", "pod1", 8080)
	want := []string{"--root=/run/gv/k8s.io", "--debug=true", "--platform=systrap", "port-forward", "--stream", "/run/crisp/portforward/pf-1/s", "pod1", "8080"}
	if !slices.Equal(got, want) {
		t.Fatalf("Args:\n got %q\nwant %q", got, want)
	}
}

// A runsc that cannot be run, or one that fails, gives an error saying why (runsc's
// stderr included), and leaves no socket behind.
func TestDialFails(t *testing.T) {
	cases := []struct {
		name    string
		binary  string
		wantErr string
	}{
		{"missing binary", filepath.Join(t.TempDir(), "runsc"), "start runsc port-forward"},
	}
	if _, err := os.Stat(gvisorRunsc); err == nil {
		// The real runsc, with a root holding no container: it says so on stderr.
		cases = append(cases, struct{ name, binary, wantErr string }{"no such sandbox", gvisorRunsc, "loading container"})
	} else {
		t.Logf("%s not built (make gvisor): only the missing-binary case runs", gvisorRunsc)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pf")
			cfg := Config{Binary: c.binary, Root: t.TempDir()}
			conn, err := cfg.Dial(context.Background(), dir, "k8s.io", "nope", 80)
			if err == nil {
				conn.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Dial: %v; want it to say %q", err, c.wantErr)
			}
			if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("socket directory: %v, %v; want mode 0700", st, err)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("left in the socket directory: %v", left)
			}
		})
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		// Load's default binary is a name on PATH, as the shim's is.
		_, err := Config{Binary: DefaultBinary, Root: t.TempDir()}.Dial(context.Background(), t.TempDir(), "k8s.io", "nope", 80)
		if err == nil || !strings.Contains(err.Error(), "executable file not found") {
			t.Errorf("Dial with runsc not on PATH: %v", err)
		}
	}
}
