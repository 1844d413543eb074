package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// TestE2ERegistryConfig pulls through criserver's CRI, as kubelet does, with the
// registry settings of its config file: containerd hosts.toml host directories under
// registry.config_path (CA, client certificates, mirrors in order, edits applied
// without a restart), node credentials from registry.auth_file, and
// image.pull_progress_timeout cutting a registry that stalls mid-blob but not one that
// is merely slow.
func TestE2ERegistryConfig(t *testing.T) {
	e := newEnv(t)
	hostsDir := filepath.Join(e.dir, "certs.d")
	pki := filepath.Join(e.dir, "pki")
	for _, d := range []string{hostsDir, pki} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	ca := imagetest.NewCA(t, "e2e registry CA")
	clientCA := imagetest.NewCA(t, "e2e client CA")
	caFile := imagetest.WriteFile(t, pki, "ca.pem", ca.CertPEM)
	cert, key := clientCA.Issue(t, "e2e node")
	certFile := imagetest.WriteFile(t, pki, "client.cert", cert)
	keyFile := imagetest.WriteFile(t, pki, "client.key", key)

	// The node's credentials for a basic-auth registry: in the auth file only.
	authReg := imagetest.StartRegistry(t, imagetest.WithBasicAuth("node", "s3cret"))
	authFile := imagetest.WriteFile(t, pki, "config.json", fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`,
		authReg, base64.StdEncoding.EncodeToString([]byte("node:s3cret"))))

	const progressTimeout = 2 * time.Second
	e.appendConfig(fmt.Sprintf("\n[registry]\nconfig_path = %q\nauth_file = %q\n\n[image]\npull_progress_timeout = %q\n",
		hostsDir, authFile, progressTimeout.String()))
	e.start()
	ctx := ctxT(t)
	pull := func(ref string, auth *cri.AuthConfig) (string, error) {
		pctx, cancel := regPullCtx(ctx)
		defer cancel()
		resp, err := e.img.PullImage(pctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}, Auth: auth})
		return resp.GetImageRef(), err
	}

	t.Run("ca", func(t *testing.T) {
		reg := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, nil)))
		img := regImage(t, "tls")
		imagetest.Push(t, reg, "team/tls:v1", img, regPush{ca: ca}.option(t))
		ref := reg + "/team/tls:v1"
		// Without the CA the registry's certificate is not trusted, loopback or not:
		// a hosts.toml names the host.
		imagetest.WriteHosts(t, hostsDir, reg, fmt.Sprintf("server = %q\n", "https://"+reg))
		_, err := pull(ref, nil)
		if err == nil || !strings.Contains(err.Error(), reg) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("pull without the CA: %v, want a verification error naming %s", err, reg)
		}
		imagetest.WriteHosts(t, hostsDir, reg, fmt.Sprintf("server = %q\nca = %q\n", "https://"+reg, caFile))
		id, err := pull(ref, nil)
		if err != nil {
			t.Fatalf("pull with the CA: %v", err)
		}
		if want := imagetest.ConfigDigest(t, img).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}
	})

	t.Run("client-cert", func(t *testing.T) {
		reg := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, clientCA)))
		img := regImage(t, "mtls")
		imagetest.Push(t, reg, "team/mtls:v1", img, regPush{ca: ca, cert: cert, key: key}.option(t))
		ref := reg + "/team/mtls:v1"
		imagetest.WriteHosts(t, hostsDir, reg, fmt.Sprintf("server = %q\nca = %q\n", "https://"+reg, caFile))
		if _, err := pull(ref, nil); err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("pull without a client certificate: %v, want the registry to require one", err)
		}
		imagetest.WriteHosts(t, hostsDir, reg, fmt.Sprintf("server = %q\nca = %q\nclient = [[%q, %q]]\n", "https://"+reg, caFile, certFile, keyFile))
		id, err := pull(ref, nil)
		if err != nil {
			t.Fatalf("pull with the client certificate: %v", err)
		}
		if want := imagetest.ConfigDigest(t, img).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}
	})

	t.Run("mirrors", func(t *testing.T) {
		var brokenLog, goodLog imagetest.RequestLog
		broken := imagetest.StartRegistry(t, brokenLog.Option(), imagetest.WithErrorStatus(http.StatusServiceUnavailable, nil))
		good := imagetest.StartRegistry(t, goodLog.Option())
		img := regImage(t, "mirrored")
		imagetest.Push(t, good, "team/mirrored:v1", img)
		goodLog.Reset()
		// The registry itself is unreachable: everything comes from the mirrors, the
		// first of which answers 503.
		const name = "mirrors.crisp-e2e.example"
		imagetest.WriteHosts(t, hostsDir, name, fmt.Sprintf(`server = %q

[host.%q]
  capabilities = ["pull", "resolve"]

[host.%q]
  capabilities = ["pull", "resolve"]
`, "https://"+imagetest.ClosedAddr(t), "http://"+broken, "http://"+good))
		ref := name + "/team/mirrored:v1"
		id, err := pull(ref, nil)
		if err != nil {
			t.Fatalf("pull through the mirrors: %v", err)
		}
		if want := imagetest.ConfigDigest(t, img).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}
		if brokenLog.Count("/v2/") == 0 {
			t.Error("the first mirror was never asked")
		}
		if goodLog.Count("/blobs/") == 0 {
			t.Error("the second mirror served no blob")
		}
		st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
		if err != nil || !slices.Contains(st.GetImage().GetRepoTags(), ref) {
			t.Errorf("the image is not listed by the name it was pulled by: %v %v", st.GetImage(), err)
		}
	})

	t.Run("edit", func(t *testing.T) {
		a, b := imagetest.StartRegistry(t), imagetest.StartRegistry(t)
		imgA, imgB := regImage(t, "edit-a"), regImage(t, "edit-b")
		imagetest.Push(t, a, "team/edit:v1", imgA)
		imagetest.Push(t, b, "team/edit:v1", imgB)
		const name = "edit.crisp-e2e.example"
		hosts := func(mirror string) string {
			return fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "https://"+imagetest.ClosedAddr(t), "http://"+mirror)
		}
		ref := name + "/team/edit:v1"
		imagetest.WriteHosts(t, hostsDir, name, hosts(a))
		id, err := pull(ref, nil)
		if err != nil || id != imagetest.ConfigDigest(t, imgA).String() {
			t.Fatalf("first pull: %s %v, want %s", id, err, imagetest.ConfigDigest(t, imgA))
		}
		// The same tag, now from the other mirror: no restart, no reload.
		imagetest.WriteHosts(t, hostsDir, name, hosts(b))
		id, err = pull(ref, nil)
		if err != nil || id != imagetest.ConfigDigest(t, imgB).String() {
			t.Fatalf("pull after editing hosts.toml: %s %v, want %s from the new mirror", id, err, imagetest.ConfigDigest(t, imgB))
		}
		st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
		if err != nil || st.GetImage().GetId() != id {
			t.Errorf("the tag now names %v (%v), want %s", st.GetImage().GetId(), err, id)
		}
	})

	t.Run("auth-file", func(t *testing.T) {
		img, img2 := regImage(t, "auth"), regImage(t, "auth-cri")
		imagetest.Push(t, authReg, "team/auth:v1", img, pushAuth("node", "s3cret"))
		imagetest.Push(t, authReg, "team/auth-cri:v1", img2, pushAuth("node", "s3cret"))
		id, err := pull(authReg+"/team/auth:v1", nil)
		if err != nil {
			t.Fatalf("pull with the node's credentials: %v", err)
		}
		if want := imagetest.ConfigDigest(t, img).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}
		// Credentials in the request win over the file, even wrong ones.
		_, err = pull(authReg+"/team/auth-cri:v1", &cri.AuthConfig{Username: "node", Password: "wrong", ServerAddress: authReg})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "rejected the credentials") {
			t.Errorf("pull with wrong CRI credentials: %v, want Unauthenticated: the request's credentials win", err)
		}
	})

	t.Run("progress-timeout", func(t *testing.T) {
		img := imagetest.BuildImage(t, []imagetest.TarEntry{imagetest.RandomFile("big", 256<<10, 7)})
		layer := imagetest.LayerDigests(t, img)[0]
		staller := imagetest.NewStaller()
		defer staller.Release()
		stalling := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(layer), 1000, staller))
		imagetest.Push(t, stalling, "team/stall:v1", img)
		ref := stalling + "/team/stall:v1"

		before := regStoreFiles(e.root)
		start := time.Now()
		var wg sync.WaitGroup
		errs, took := make([]error, 2), make([]time.Duration, 2)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = pull(ref, nil)
				took[i] = time.Since(start)
			}()
		}
		wg.Wait()
		t.Logf("stalled pulls ended after %v and %v", took[0], took[1])
		for i, err := range errs {
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), layer.String()) ||
				!strings.Contains(err.Error(), stalling) || !strings.Contains(err.Error(), "pull_progress_timeout") {
				t.Errorf("stalled pull %d: %v, want Unavailable naming the layer %s, the registry and image.pull_progress_timeout", i, err, layer)
			}
			// Sharing the stalled download, both end one timeout after it stalled:
			// a pull that waited for the other and then tried the registry itself
			// would wait out the timeout a second time.
			if took[i] < progressTimeout || took[i] >= 2*progressTimeout {
				t.Errorf("stalled pull %d ended after %v with a %v timeout, want both within [%v, %v)", i, took[i], progressTimeout, progressTimeout, 2*progressTimeout)
			}
		}
		if n := regDrain(staller.Stalled()); n != 1 {
			t.Errorf("the registry saw %d stalled downloads of the layer, want 1: the concurrent pulls do not share the stalled download", n)
		}
		list, err := e.img.ListImages(ctx, &cri.ListImagesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range list.Images {
			for _, tag := range im.RepoTags {
				if strings.HasPrefix(tag, stalling+"/") {
					t.Errorf("ListImages shows the stalled image: %v", im)
				}
			}
		}
		// Nothing of the failed pull stays in the image store.
		var left []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			left = left[:0]
			for p := range regStoreFiles(e.root) {
				if !before[p] {
					left = append(left, p)
				}
			}
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(left) > 0 {
			slices.Sort(left)
			t.Errorf("the failed pulls left in %s:\n  %s", filepath.Join(e.root, "images"), strings.Join(left, "\n  "))
		}

		// Once the registry sends again, a new pull completes.
		staller.Release()
		id, err := pull(ref, nil)
		if err != nil {
			t.Fatalf("pull after the stall: %v", err)
		}
		if want := imagetest.ConfigDigest(t, img).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}

		// A slow registry that keeps sending takes longer than the timeout and is not
		// cut: 16 KiB every 300 ms.
		slowImg := imagetest.BuildImage(t, []imagetest.TarEntry{imagetest.RandomFile("big", 256<<10, 8)})
		slow := imagetest.StartRegistry(t, imagetest.WithSlowBlobs(imagetest.Blobs(imagetest.LayerDigests(t, slowImg)...), 16<<10, 300*time.Millisecond))
		imagetest.Push(t, slow, "team/slow:v1", slowImg)
		start = time.Now()
		id, err = pull(slow+"/team/slow:v1", nil)
		d := time.Since(start)
		if err != nil {
			t.Fatalf("slow pull: %v (after %v)", err, d)
		}
		if want := imagetest.ConfigDigest(t, slowImg).String(); id != want {
			t.Errorf("pulled %s, want %s", id, want)
		}
		t.Logf("the slow pull took %v", d)
		if d < progressTimeout {
			t.Errorf("the slow pull took %v, not longer than the %v timeout: it proves nothing", d, progressTimeout)
		}
	})
}

// regImage returns a small image of one layer whose content is name's own, so that
// no two cases share a blob and a cached blob cannot make a pull pass.
func regImage(t *testing.T, name string) v1.Image {
	t.Helper()
	return imagetest.BuildImage(t, []imagetest.TarEntry{imagetest.File("case", name+"\n")})
}

// regPush is how the test itself pushes to a registry that a pull reaches through a
// hosts.toml: trusting ca, with a client certificate, below a path prefix, with
// headers.
type regPush struct {
	ca        *imagetest.CA
	cert, key []byte
	prefix    string
	header    http.Header
}

func (o regPush) option(t *testing.T) ggcrremote.Option {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if o.ca != nil {
		tr.TLSClientConfig.RootCAs = o.ca.Pool()
	}
	if o.cert != nil {
		pair, err := tls.X509KeyPair(o.cert, o.key)
		if err != nil {
			t.Fatal(err)
		}
		tr.TLSClientConfig.Certificates = []tls.Certificate{pair}
	}
	return ggcrremote.WithTransport(&regRewrite{next: tr, prefix: o.prefix, header: o.header})
}

// regRewrite moves requests below a path prefix and adds headers.
type regRewrite struct {
	next   http.RoundTripper
	prefix string
	header http.Header
}

func (r *regRewrite) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if rest, ok := strings.CutPrefix(req.URL.Path, "/v2"); ok && r.prefix != "" {
		req.URL.Path, req.URL.RawPath = r.prefix+rest, ""
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	return r.next.RoundTrip(req)
}

// regStoreFiles lists what is under criserver's content store and snapshots, relative
// to root/images.
func regStoreFiles(root string) map[string]bool {
	base := filepath.Join(root, "images")
	out := map[string]bool{}
	for _, d := range []string{"content", "snapshots"} {
		_ = filepath.WalkDir(filepath.Join(base, d), func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				rel, _ := filepath.Rel(base, p)
				out[rel] = true
			}
			return nil
		})
	}
	return out
}

// regDrain counts what ch holds now.
func regDrain[T any](ch <-chan T) int {
	for n := 0; ; n++ {
		select {
		case <-ch:
		default:
			return n
		}
	}
}

// regPullTimeout bounds one pull in the registry tests.
const regPullTimeout = time.Minute

// regPullCtx is ctx bounded by regPullTimeout.
func regPullCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, regPullTimeout)
}
