package remote

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/sigpolicy"
)

// cosignBinary is where hack/cosign.sh caches the cosign CLI (COSIGN_CACHE).
func cosignBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("COSIGN_CACHE")
	if dir == "" {
		dir = "/var/cache/crisp/cosign-v2.6.5"
	}
	bin := filepath.Join(dir, "bin", "cosign")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("cosign is not built (hack/cosign.sh builds it): %v", err)
	}
	return bin
}

// TestCosignInterop signs images with the cosign CLI itself, in its default tag
// storage and in its OCI 1.1 referrers mode, and pulls them under a sigstoreSigned
// policy: what crisp verifies is what cosign writes, not only what crisp's tests
// write.
func TestCosignInterop(t *testing.T) {
	cosign := cosignBinary(t)
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(cosign, args...)
		cmd.Dir = dir
		// No network but loopback: nothing may reach Rekor, Fulcio or a TUF mirror.
		cmd.Env = []string{"HOME=" + dir, "COSIGN_PASSWORD=test", "COSIGN_EXPERIMENTAL=1", "PATH=/usr/bin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cosign %v: %v\n%s", args, err, out)
		}
	}
	run("generate-key-pair")
	reg := imagetest.StartRegistry(t, imagetest.WithReferrers())
	refs := map[string]string{}
	for _, repo := range []string{"tagged", "referred", "unsigned"} {
		img, err := random.Image(1<<16, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := imagetest.Push(t, reg, "team/"+repo+":v1", img)
		refs[repo] = fmt.Sprintf("%s/team/%s@%s", reg, repo, d)
	}
	common := []string{"sign", "--key", "cosign.key", "--tlog-upload=false", "--allow-http-registry", "--allow-insecure-registry", "--yes"}
	run(append(common, refs["tagged"])...)
	run(append(common, "--registry-referrers-mode=oci-1-1", refs["referred"])...)

	pol, err := sigpolicy.Parse([]byte(fmt.Sprintf(`{"default": [{"type": "reject"}], "transports": {"docker": {%q:
	  [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}]}}}`,
		reg+"/team", filepath.Join(dir, "cosign.pub"))), "policy.json")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newPuller(t, Config{Policy: pol})
	for _, tc := range []struct {
		repo string
		ok   bool
	}{{"tagged", true}, {"referred", true}, {"unsigned", false}} {
		for _, ref := range []string{refs[tc.repo], reg + "/team/" + tc.repo + ":v1"} {
			_, err := p.Pull(context.Background(), ref, nil)
			if (err == nil) != tc.ok {
				t.Errorf("pull %s: %v, want ok=%v", ref, err, tc.ok)
			}
		}
	}
}
