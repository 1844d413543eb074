package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanImportGraph keeps what every per-pod shim process pays for out of its binary:
// each of these was measured to cost private memory per pod (package init, memory
// profiling the linker can only switch off without runtime/pprof) or binary pages.
func TestLeanImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "seccomp", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	if !deps["github.com/containerd/ttrpc"] {
		t.Fatalf("go list -deps did not list ttrpc; output:\n%s", out)
	}
	for _, banned := range []string{
		"google.golang.org/grpc",
		"runtime/pprof",
		"net/http",
		"github.com/containerd/containerd/api/runtime/task/v3",
		"github.com/containerd/containerd/api/runtime/sandbox/v1",
		"github.com/containerd/containerd/api/types",
		"github.com/opencontainers/go-digest",
		"google.golang.org/protobuf/types/descriptorpb",
		"k8s.io/cri-api/pkg/apis/runtime/v1",
		// Its init runs in every shim, container init and exec: 15 KB, ~0.4 ms.
		"runtime/metrics",
		// Patterns compiled at init cost every shim, container init and exec (130 KB once).
		"regexp",
		// Generated OTLP types: descriptors registered at every start and marshalling
		// tables at the first traced call (the recorder encodes OTLP by hand).
		"go.opentelemetry.io/proto/otlp/trace/v1",
		"go.opentelemetry.io/proto/otlp/common/v1",
		// The SDK links net/http and regexp; the shim records with its own recorder.
		"go.opentelemetry.io/otel/sdk/trace",
	} {
		if deps[banned] {
			t.Errorf("shim-runc links %s", banned)
		}
	}
}
