package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseBootstrapParams(t *testing.T) {
	params := marshal(t, &bootstrap.BootstrapParams{InstanceID: "pod1", Namespace: "k8s.io"})
	// Runtime options as containerd ≤2.2 sends them: an Any whose type_url and value
	// decode as instance_id and namespace.
	legacyAny := marshal(t, &anypb.Any{TypeUrl: "containerd.runc.v1.Options", Value: []byte("k8s.io")})
	tests := []struct {
		name          string
		input         []byte
		cliID, cliNS  string
		wantBootstrap bool
	}{
		{"empty stdin", nil, "pod1", "k8s.io", false},
		{"params matching the flags", params, "pod1", "k8s.io", true},
		{"params for another id", params, "pod2", "k8s.io", false},
		{"params for another namespace", params, "pod1", "default", false},
		{"params without flags", params, "", "", true},
		{"runtime options Any", legacyAny, "pod1", "k8s.io", false},
		{"garbage", []byte{0xff, 0xff, 0xff}, "pod1", "k8s.io", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok := parseBootstrapParams(tt.input, tt.cliID, tt.cliNS)
			if ok != tt.wantBootstrap {
				t.Fatalf("bootstrap = %v, want %v", ok, tt.wantBootstrap)
			}
		})
	}
}

func TestResolveStartParams(t *testing.T) {
	dir := "/run/x"
	boot := marshal(t, &bootstrap.BootstrapParams{
		InstanceID: "pod1", Namespace: "k8s.io", ContainerdGrpcAddress: "/run/c.sock",
		ContainerdTtrpcAddress: "/run/c.sock.ttrpc", SocketDir: &dir, LogLevel: bootstrap.LogLevel_LOG_LEVEL_DEBUG,
	})
	t.Setenv("NAMESPACE", "")
	t.Setenv("GRPC_ADDRESS", "")
	tests := []struct {
		name    string
		flags   Flags
		input   []byte
		want    startParams
		wantErr bool
	}{
		{
			name:  "bootstrap",
			flags: Flags{ID: "pod1", Namespace: "k8s.io"},
			input: boot,
			want:  startParams{id: "pod1", namespace: "k8s.io", address: "/run/c.sock", ttrpcAddress: "/run/c.sock.ttrpc", socketDir: "/run/x", debug: true, bootstrap: true},
		},
		{
			name:  "legacy defaults",
			flags: Flags{ID: "pod1"},
			want:  startParams{id: "pod1", namespace: "default", socketDir: DefaultSocketDir},
		},
		{name: "legacy without id", flags: Flags{Namespace: "k8s.io"}, wantErr: true},
		{name: "id with a slash", flags: Flags{ID: "../x"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveStartParams(tt.flags, tt.input, "/b")
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			tt.want.bundle = "/b"
			if got != tt.want {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestSocketPath(t *testing.T) {
	sum := sha256.Sum256([]byte("/run/containerd/containerd.sock/k8s.io/abc"))
	want := "/run/crisp/s/" + hex.EncodeToString(sum[:])
	if got := SocketPath(DefaultSocketDir, "/run/containerd/containerd.sock", "k8s.io", "abc"); got != want {
		t.Fatalf("SocketPath = %q, want %q", got, want)
	}
	if len(want) > maxSocketPath {
		t.Fatalf("default socket path is %d bytes, over %d", len(want), maxSocketPath)
	}
}

func TestResult(t *testing.T) {
	legacy, err := startParams{}.result("/run/crisp/s/abc")
	if err != nil || string(legacy) != "unix:///run/crisp/s/abc" {
		t.Fatalf("legacy result = %q, %v; want the bare address", legacy, err)
	}
	out, err := startParams{bootstrap: true}.result("/run/crisp/s/abc")
	if err != nil {
		t.Fatal(err)
	}
	var res bootstrap.BootstrapResult
	if err := proto.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if res.GetVersion() != 3 || res.GetAddress() != "unix:///run/crisp/s/abc" || res.GetProtocol() != "ttrpc" {
		t.Fatalf("bootstrap result = %v", &res)
	}
}

func TestChildEnv(t *testing.T) {
	env := childEnv([]string{"PATH=/bin", "TTRPC_ADDRESS=/old", "GRPC_ADDRESS=/g"},
		startParams{bootstrap: true, namespace: "k8s.io", ttrpcAddress: "/new"})
	slices.Sort(env)
	// No containerd gRPC address in the params: the inherited one stays.
	want := []string{"GRPC_ADDRESS=/g", "NAMESPACE=k8s.io", "PATH=/bin", "TTRPC_ADDRESS=/new"}
	if !slices.Equal(env, want) {
		t.Fatalf("env = %v, want %v", env, want)
	}
	// crisp's controller bootstraps without a ttrpc address: no events go to an
	// address the shim merely inherited.
	env = childEnv([]string{"TTRPC_ADDRESS=/inherited"}, startParams{bootstrap: true, namespace: "crisp"})
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "TTRPC_ADDRESS=") }) {
		t.Fatalf("env = %v: TTRPC_ADDRESS without one in the bootstrap params", env)
	}
	// The legacy path passes the caller's environment on.
	if env := childEnv([]string{"TTRPC_ADDRESS=/ctrd"}, startParams{}); !slices.Contains(env, "TTRPC_ADDRESS=/ctrd") {
		t.Fatalf("legacy env = %v: TTRPC_ADDRESS lost", env)
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"pod1": true, "a.b_c-d": true, strings.Repeat("a", 128): true,
		"": false, "-a": false, ".a": false, "a/b": false, "a b": false, strings.Repeat("a", 129): false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestLegacyGroup(t *testing.T) {
	tests := []struct {
		name, spec, want string
	}{
		{name: "no spec", want: "ctr1"},
		{name: "malformed spec", spec: "{", want: "ctr1"},
		{name: "no annotation", spec: `{"annotations":{"other":"x"}}`, want: "ctr1"},
		{name: "cri sandbox id", spec: `{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}`, want: "pod1"},
		{name: "runc group first", spec: `{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1","io.containerd.runc.v2.group":"g"}}`, want: "g"},
		{name: "empty group", spec: `{"annotations":{"io.containerd.runc.v2.group":"","io.kubernetes.cri.sandbox-id":"pod1"}}`, want: "pod1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.spec != "" {
				if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tt.spec), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := legacyGroup(dir, "ctr1"); got != tt.want {
				t.Errorf("legacyGroup = %q, want %q", got, tt.want)
			}
		})
	}
}
