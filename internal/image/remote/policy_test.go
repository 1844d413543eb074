package remote

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/crisp-runtime/crisp/internal/image/content"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/sigpolicy"
)

// signedRegistry serves team/signed:v1 (signed with key), team/unsigned:v1, and
// team/forged:v1 (signed with another key), and returns its host.
func signedRegistry(t testing.TB, key *imagetest.CosignKey) string {
	reg := imagetest.StartRegistry(t)
	other := imagetest.NewCosignKey(t)
	for _, repo := range []string{"team/signed", "team/unsigned", "team/forged", "open/app", "other/app"} {
		img, err := random.Image(1<<20, 2)
		if err != nil {
			t.Fatal(err)
		}
		d := imagetest.Push(t, reg, repo+":v1", img)
		switch repo {
		case "team/signed":
			key.Sign(t, reg, repo, d)
		case "team/forged":
			other.Sign(t, reg, repo, d)
		}
	}
	return reg
}

func policyFor(t testing.TB, reg string, key *imagetest.CosignKey) *sigpolicy.Policy {
	keyPath := imagetest.WriteFile(t, t.TempDir(), "cosign.pub", key.PublicPEM)
	pol, err := sigpolicy.Parse([]byte(fmt.Sprintf(`{
  "default": [{"type": "reject"}],
  "transports": {"docker": {
    %q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}],
    %q: [{"type": "insecureAcceptAnything"}]
  }}}`, reg+"/team", keyPath, reg+"/open")), "policy.json")
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func TestPullSignaturePolicy(t *testing.T) {
	key := imagetest.NewCosignKey(t)
	reg := signedRegistry(t, key)
	p, cs := newPuller(t, Config{Policy: policyFor(t, reg, key)})
	for _, tc := range []struct{ repo, want string }{
		{"team/signed", ""},
		{"open/app", ""},
		{"team/unsigned", "no signature"},
		{"team/forged", "sigstoreSigned"},
		{"other/app", "reject"},
	} {
		t.Run(tc.repo, func(t *testing.T) {
			before := len(storedBlobs(t, cs))
			_, err := p.Pull(context.Background(), reg+"/"+tc.repo+":v1", nil)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v, want PermissionDenied with %q", err, tc.want)
			}
			if after := len(storedBlobs(t, cs)); after != before {
				t.Errorf("a refused pull stored %d blobs", after-before)
			}
		})
	}
}

// BenchmarkPullSignaturePolicy measures a whole pull (2 layers of 1 MiB, from a
// loopback registry, into an empty store) without and with a sigstoreSigned policy:
// the difference is the cost of verification per pull.
func BenchmarkPullSignaturePolicy(b *testing.B) {
	key := imagetest.NewCosignKey(b)
	reg := signedRegistry(b, key)
	for _, bc := range []struct {
		name string
		pol  *sigpolicy.Policy
	}{{"no-policy", nil}, {"sigstoreSigned", policyFor(b, reg, key)}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				cs, err := content.Open(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				p := New(Config{Policy: bc.pol}, cs, nil)
				b.StartTimer()
				if _, err := p.Pull(context.Background(), reg+"/team/signed:v1", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPullProgressTimeout measures what the progress watchdog costs a download:
// a 64 MiB layer from a loopback registry into an empty store, without it and with
// the default timeout (an atomic store per read of the connection).
func BenchmarkPullProgressTimeout(b *testing.B) {
	reg := imagetest.StartRegistry(b)
	img, err := random.Image(64<<20, 1)
	if err != nil {
		b.Fatal(err)
	}
	imagetest.Push(b, reg, "big/app:v1", img)
	for _, bc := range []struct {
		name    string
		timeout time.Duration
	}{{"off", 0}, {"5m", 5 * time.Minute}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for b.Loop() {
				b.StopTimer()
				cs, err := content.Open(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				p := New(Config{ProgressTimeout: bc.timeout}, cs, nil)
				b.StartTimer()
				if _, err := p.Pull(context.Background(), reg+"/big/app:v1", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
