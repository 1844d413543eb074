package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

func TestHostsTomlMirrors(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	var good, broken imagetest.RequestLog
	mirror := imagetest.StartRegistry(t, good.Option())
	dead := imagetest.StartRegistry(t, broken.Option(), imagetest.WithErrorStatus(http.StatusServiceUnavailable, nil))
	imagetest.Push(t, mirror, "team/app:v1", img)
	root := t.TempDir()
	// The registry itself is not reachable: everything must come from the mirrors.
	imagetest.WriteHosts(t, root, "registry.example", fmt.Sprintf(`
server = "https://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, imagetest.ClosedAddr(t), dead, mirror))
	p, cs := newPuller(t, Config{HostsDir: root})
	got, err := p.Pull(context.Background(), "registry.example/team/app:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, cs, got, img)
	if got.Name != "registry.example/team/app:v1" || !strings.HasPrefix(got.RepoDigest, "registry.example/team/app@sha256:") {
		t.Errorf("Name %q RepoDigest %q: the image keeps the name it was asked by", got.Name, got.RepoDigest)
	}
	if broken.Count("GET /v2/") == 0 {
		t.Error("the first mirror in order was never asked")
	}
}

func TestHostsTomlCapabilities(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	var upLog, mirLog imagetest.RequestLog
	upstream := imagetest.StartRegistry(t, upLog.Option())
	mirror := imagetest.StartRegistry(t, mirLog.Option())
	imagetest.Push(t, upstream, "team/app:v1", img)
	imagetest.Push(t, mirror, "team/app:v1", img)
	upLog.Reset()
	mirLog.Reset()
	root := t.TempDir()
	// A pull-only mirror (Spegel's kind) gets no tag: the upstream resolves it.
	imagetest.WriteHosts(t, root, upstream, fmt.Sprintf(`
server = "http://%s"

[host."http://%s"]
  capabilities = ["pull"]
`, upstream, mirror))
	p, cs := newPuller(t, Config{HostsDir: root})
	got, err := p.Pull(context.Background(), upstream+"/team/app:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, cs, got, img)
	if n := mirLog.Count("/manifests/v1"); n != 0 {
		t.Errorf("the pull-only mirror was asked for the tag %d times", n)
	}
	if mirLog.Count("/blobs/") == 0 {
		t.Error("the mirror served no blob")
	}
	if n := upLog.Count("/blobs/"); n != 0 {
		t.Errorf("the upstream served %d blobs; only the tag was its to resolve", n)
	}
	if upLog.Count("HEAD /v2/team/app/manifests/v1") != 1 {
		t.Errorf("the upstream did not resolve the tag: %v", upLog.Paths())
	}

	// A host without "pull" is never used; with none left, the pull says so.
	imagetest.WriteHosts(t, root, "only-push.example", `
server = "https://only-push.example"
capabilities = ["push"]
`)
	_, err = p.Pull(context.Background(), "only-push.example/team/app:v1", nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pull capability") {
		t.Errorf("pull with no pull host: %v", err)
	}
}

func TestHostsTomlOverridePathAndHeader(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	var seen sync.Map
	reg := imagetest.StartRegistry(t, imagetest.WithPathPrefix("/api/registry/v2"), imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Tenant") != "blue" {
				http.Error(w, "no tenant", http.StatusForbidden)
				return
			}
			seen.Store(r.URL.Path, true)
			next.ServeHTTP(w, r)
		})
	}))
	// Push straight to the registry's API under its prefix.
	imagetest.Push(t, reg, "team/app:v1", img, ggcrremote.WithTransport(&endpointTransport{
		ep:     endpoint{host: reg, apiRoot: "/api/registry/v2", header: http.Header{"X-Tenant": {"blue"}}, plainHTTP: true, fromDir: "test"},
		policy: newPolicyTransport(newHostPolicy(nil, nil)),
	}))
	for _, tc := range []struct{ name, hosts string }{
		{"override_path", fmt.Sprintf(`
[host."http://%s/api/registry/v2"]
  capabilities = ["pull", "resolve"]
  override_path = true
  [host."http://%s/api/registry/v2".header]
    X-Tenant = "blue"
`, reg, reg)},
		// Without override_path containerd appends /v2 to the path.
		{"path+v2", fmt.Sprintf(`
[host."http://%s/api/registry"]
  capabilities = ["pull", "resolve"]
  header = { X-Tenant = ["blue"] }
`, reg)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			imagetest.WriteHosts(t, root, "_default", tc.hosts)
			p, cs := newPuller(t, Config{HostsDir: root})
			got, err := p.Pull(context.Background(), "anything.example/team/app:v1", nil)
			if err != nil {
				t.Fatal(err)
			}
			checkPulled(t, cs, got, img)
		})
	}
}

func TestFindHostDir(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"myreg_5000_", "plain.example", "*.example.com", "*.b.example.com", "_default"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "*.nodir.example"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ host, want string }{
		{"myreg:5000", "myreg_5000_"},
		{"plain.example", "plain.example"},
		{"a.example.com", "*.example.com"},
		{"x.b.example.com", "*.b.example.com"}, // the longest wildcard wins
		{"example.com", "_default"},            // a wildcard matches subdomains only
		{"a.example.com:5000", "_default"},     // the port is part of the name
		{"docker.io", "_default"},
	} {
		got, err := findHostDir(root, tc.host)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(got) != tc.want {
			t.Errorf("findHostDir(%s) = %s, want %s", tc.host, filepath.Base(got), tc.want)
		}
	}
	os.Remove(filepath.Join(root, "_default"))
	if got, err := findHostDir(root, "docker.io"); err != nil || got != "" {
		t.Errorf("no directory: %q, %v", got, err)
	}
}

func TestHostsTomlTLS(t *testing.T) {
	ca := imagetest.NewCA(t, "registry CA")
	clientCA := imagetest.NewCA(t, "client CA")
	otherCA := imagetest.NewCA(t, "some other CA")
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	pushTLS := &endpointTransport{policy: newPolicyTransport(newHostPolicy(nil, nil))}

	plain := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, nil)))
	mtls := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, clientCA)))
	dir := t.TempDir()
	caFile := imagetest.WriteFile(t, dir, "ca.pem", ca.CertPEM)
	otherFile := imagetest.WriteFile(t, dir, "other.pem", otherCA.CertPEM)
	cert, key := clientCA.Issue(t, "node")
	certFile := imagetest.WriteFile(t, dir, "client.cert", cert)
	keyFile := imagetest.WriteFile(t, dir, "client.key", key)
	both := imagetest.WriteFile(t, dir, "client-both.pem", append(append([]byte{}, cert...), key...))
	badCert, badKey := otherCA.Issue(t, "stranger")
	badCertFile := imagetest.WriteFile(t, dir, "bad.cert", badCert)
	badKeyFile := imagetest.WriteFile(t, dir, "bad.key", badKey)
	garbage := imagetest.WriteFile(t, dir, "garbage.pem", []byte("not a certificate"))

	for _, host := range []string{plain, mtls} {
		tr := newHTTPTransport(false)
		tr.TLSClientConfig.RootCAs = ca.Pool()
		pair, err := tlsPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		tr.TLSClientConfig.Certificates = append(tr.TLSClientConfig.Certificates, pair)
		pushTLS.ep = endpoint{host: host, transport: tr, fromDir: "test"}
		imagetest.Push(t, host, "team/app:v1", img, ggcrremote.WithTransport(pushTLS))
	}

	for _, tc := range []struct {
		name, host, hosts string
		wantErr           string // "" succeeds
	}{
		{"ca", plain, `ca = "` + caFile + `"`, ""},
		{"ca-relative", plain, `ca = "../ca.pem"`, ""},
		{"ca-list", plain, `ca = ["` + otherFile + `", "` + caFile + `"]`, ""},
		// A hosts.toml names the host: the loopback exemption from verification
		// does not apply, as in containerd.
		{"no-ca", plain, ``, "certificate signed by unknown authority"},
		{"wrong-ca", plain, `ca = "` + otherFile + `"`, "certificate signed by unknown authority"},
		{"missing-ca", plain, `ca = "/nonexistent/ca.pem"`, `unable to read CA cert "/nonexistent/ca.pem"`},
		{"garbage-ca", plain, `ca = "` + garbage + `"`, `unable to load CA cert "` + garbage + `"`},
		{"skip_verify", plain, `skip_verify = true`, ""},
		{"client-pair", mtls, `ca = "` + caFile + `"
client = [["` + certFile + `", "` + keyFile + `"]]`, ""},
		{"client-one-file", mtls, `ca = "` + caFile + `"
client = "` + both + `"`, ""},
		{"client-missing", mtls, `ca = "` + caFile + `"`, "certificate required"},
		{"client-untrusted", mtls, `ca = "` + caFile + `"
client = [["` + badCertFile + `", "` + badKeyFile + `"]]`, "certificate required"}, // Go sends only a certificate the server's CAs issued
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			imagetest.WriteFile(t, root, "ca.pem", ca.CertPEM)
			imagetest.WriteHosts(t, root, tc.host, "server = \"https://"+tc.host+"\"\n"+tc.hosts+"\n")
			p, cs := newPuller(t, Config{HostsDir: root})
			got, err := p.Pull(context.Background(), tc.host+"/team/app:v1", nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkPulled(t, cs, got, img)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("pull: %v, want an error with %q", err, tc.wantErr)
			}
			if strings.Contains(tc.name, "ca") && !strings.Contains(err.Error(), tc.host) {
				t.Errorf("the error does not name the host: %v", err)
			}
			if n := len(storedBlobs(t, cs)); n != 0 {
				t.Errorf("%d blobs stored by a failed pull", n)
			}
		})
	}
}

func TestHostsTomlErrors(t *testing.T) {
	root := t.TempDir()
	imagetest.WriteHosts(t, root, "syntax.example", "server = \"https://syntax.example\"\n[host.\"https://m.example\"\ncapabilities = [\"pull\"]\n")
	imagetest.WriteHosts(t, root, "caps.example", "[host.\"https://m.example\"]\ncapabilities = [\"pull\", \"fetch\"]\n")
	imagetest.WriteHosts(t, root, "type.example", "[host.\"https://m.example\"]\nskip_verify = \"yes\"\n")
	p, _ := newPuller(t, Config{HostsDir: root})
	for _, tc := range []struct{ host, want string }{
		{"syntax.example", filepath.Join(root, "syntax.example", "hosts.toml") + ":2:"},
		{"caps.example", `unknown capability "fetch"`},
		{"type.example", "skip_verify"},
	} {
		_, err := p.Pull(context.Background(), tc.host+"/app:v1", nil)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.host) {
			t.Errorf("pull from %s: %v, want FailedPrecondition naming the host and %q", tc.host, err, tc.want)
		}
	}
	if err := CheckHostsDir(root); err == nil || !strings.Contains(err.Error(), "hosts.toml") {
		t.Errorf("CheckHostsDir: %v", err)
	}
	// As in containerd, a config_path that does not exist configures nothing.
	if err := CheckHostsDir(filepath.Join(root, "nonexistent")); err != nil {
		t.Errorf("CheckHostsDir of a missing directory: %v", err)
	}
	if d, err := findHostDir(filepath.Join(root, "nonexistent"), "x.example"); d != "" || err != nil {
		t.Errorf("findHostDir in a missing directory: %q, %v", d, err)
	}
}

// TestHostsTomlEditsApplyNextPull checks the files are read for every pull: no
// restart or reload is needed, as with containerd.
func TestHostsTomlEditsApplyNextPull(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	a := imagetest.StartRegistry(t)
	b := imagetest.StartRegistry(t)
	imagetest.Push(t, a, "team/app:v1", img)
	root := t.TempDir()
	hosts := func(mirror string) string {
		return fmt.Sprintf("server = \"https://%s\"\n[host.\"http://%s\"]\n", imagetest.ClosedAddr(t), mirror)
	}
	imagetest.WriteHosts(t, root, "registry.example", hosts(a))
	p, _ := newPuller(t, Config{HostsDir: root})
	if _, err := p.Pull(context.Background(), "registry.example/team/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	imagetest.WriteHosts(t, root, "registry.example", hosts(b)) // b does not have it
	_, err := p.Pull(context.Background(), "registry.example/team/app:v1", nil)
	if err == nil || !strings.Contains(err.Error(), b) {
		t.Fatalf("pull after the edit: %v, want a failure from %s", err, b)
	}
	if err := os.RemoveAll(filepath.Join(root, "registry.example")); err != nil {
		t.Fatal(err)
	}
	// No directory: the reference's registry itself, which does not exist.
	_, err = p.Pull(context.Background(), "registry.example/team/app:v1", nil)
	if err == nil || strings.Contains(err.Error(), b) {
		t.Fatalf("pull with the directory gone: %v", err)
	}
}

func TestHostsTomlPrecedenceOverMirrors(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	viaHosts := imagetest.StartRegistry(t)
	viaMirrors := imagetest.StartRegistry(t)
	imagetest.Push(t, viaHosts, "team/app:v1", img)
	root := t.TempDir()
	imagetest.WriteHosts(t, root, "one.example", fmt.Sprintf("server = \"http://%s\"\n", viaHosts))
	p, _ := newPuller(t, Config{HostsDir: root, Mirrors: map[string][]string{
		"one.example": {"http://" + viaMirrors}, // not used: one.example has a directory
		"two.example": {"http://" + viaHosts},   // used: two.example has none
	}})
	for _, ref := range []string{"one.example/team/app:v1", "two.example/team/app:v1"} {
		if _, err := p.Pull(context.Background(), ref, nil); err != nil {
			t.Errorf("pull %s: %v", ref, err)
		}
	}
}

// TestProgressTimeout checks a registry that sends headers and then stops mid-blob is
// cut at the timeout with an error naming the registry, the layer and the setting;
// that the store keeps nothing of it; and that a slow registry that keeps sending is
// not cut although the download takes longer than the timeout.
func TestProgressTimeout(t *testing.T) {
	img := imagetest.BuildImage(t, [][]imagetest.TarEntry{{imagetest.RandomFile("big", 256<<10, 1)}}...)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	staller := imagetest.NewStaller()
	stalling := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(nil, 1000, staller))
	slow := imagetest.StartRegistry(t, imagetest.WithSlowBlobs(nil, 16<<10, 50*time.Millisecond))
	imagetest.Push(t, stalling, "team/app:v1", img)
	imagetest.Push(t, slow, "team/app:v1", img)

	const timeout = 400 * time.Millisecond
	p, cs := newPuller(t, Config{ProgressTimeout: timeout})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2) // two pulls wait on the same download
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Pull(context.Background(), stalling+"/team/app:v1", nil)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		var st *StalledError
		if !errors.As(err, &st) || !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), ld.String()) ||
			!strings.Contains(err.Error(), stalling) || !strings.Contains(err.Error(), "pull_progress_timeout") {
			t.Errorf("stalled pull: %v, want a stall naming the registry, the layer and the setting", err)
		}
	}
	if took < timeout || took > 10*timeout {
		t.Errorf("the stalled pull ended after %v with a %v timeout", took, timeout)
	}
	for d := range storedBlobs(t, cs) {
		if d.String() == ld.String() {
			t.Error("the stalled layer is stored")
		}
	}
	if n := leftovers(t, cs); n != 0 {
		t.Errorf("%d partial files left in the content store", n)
	}

	start = time.Now()
	got, err := p.Pull(context.Background(), slow+"/team/app:v1", nil)
	if err != nil {
		t.Fatalf("slow pull: %v", err)
	}
	checkPulled(t, cs, got, img)
	if took := time.Since(start); took < timeout {
		t.Errorf("the slow pull took %v, not longer than the timeout: the test proves nothing", took)
	}

	// The next pull of the stalled image starts afresh and completes once the
	// registry sends.
	staller.Release()
	if _, err := p.Pull(context.Background(), stalling+"/team/app:v1", nil); err != nil {
		t.Fatalf("pull after the stall: %v", err)
	}
}

// leftovers counts files under the content store's root that are not blobs.
func leftovers(t *testing.T, cs interface{ Root() string }) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(cs.Root(), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(p, "/blobs/") {
			n++
			t.Logf("leftover %s", p)
		}
		return nil
	})
	return n
}

func tlsPair(cert, key []byte) (tls.Certificate, error) { return tls.X509KeyPair(cert, key) }
