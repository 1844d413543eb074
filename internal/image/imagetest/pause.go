package imagetest

import (
	"github.com/crisp-runtime/crisp/internal/testutil"

	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// PauseImage is test/bench/pause/pause.c built static (gcc) as an image whose entrypoint is
// /pause: the sandbox image containerd's podsandbox runs for each pod in the tests and
// the benchmark.
func PauseImage(t testing.TB) v1.Image {
	t.Helper()
	src := filepath.Join(testutil.RepoRoot(), "test", "bench", "pause", "pause.c")
	out := filepath.Join(t.TempDir(), "pause")
	if b, err := exec.Command("gcc", "-static", "-Os", "-s", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return NewImage(t, ImageOptions{Config: v1.Config{Entrypoint: []string{"/pause"}}},
		NewLayer(t, OCI, Gzip, Executable("pause", bin)))
}
